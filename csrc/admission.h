/* Admission counter state: plain C, no Python API. The caller holds the GIL, which makes each call atomic. */
#ifndef ROSEFAST_ADMISSION_H
#define ROSEFAST_ADMISSION_H

#include <stdint.h>

typedef struct {
    int64_t limit;            /* < 0: unlimited */
    int64_t inflight;
    uint64_t accepted_total;
    uint64_t rejected_total;
} rf_admission;

static inline void rf_admission_init(rf_admission *a, int64_t limit) {
    a->limit = limit;
    a->inflight = 0;
    a->accepted_total = 0;
    a->rejected_total = 0;
}

/* 1 when a slot was taken, 0 when the request is refused. */
static inline int rf_admission_try_acquire(rf_admission *a) {
    if (a->limit >= 0 && a->inflight >= a->limit) {
        a->rejected_total++;
        return 0;
    }
    a->inflight++;
    a->accepted_total++;
    return 1;
}

/* 0 on success, -1 when nothing is held (a release without an acquire). */
static inline int rf_admission_release(rf_admission *a) {
    if (a->inflight <= 0) {
        return -1;
    }
    a->inflight--;
    return 0;
}

#endif
