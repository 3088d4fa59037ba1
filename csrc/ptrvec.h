/* A growable array of pointers: plain C, no Python API. The collector keeps owned object references
   in two of these (token ids, text pieces), so a merge is a few stores, not a Python call. */
#ifndef ROSEFAST_PTRVEC_H
#define ROSEFAST_PTRVEC_H

#include <stdlib.h>

typedef struct {
    void **items;
    size_t len;
    size_t cap;
} rf_ptrvec;

static inline void rf_ptrvec_init(rf_ptrvec *v) {
    v->items = NULL;
    v->len = 0;
    v->cap = 0;
}

/* Make room for `extra` more items: 0 on success, -1 when out of memory (nothing changed). */
static inline int rf_ptrvec_reserve(rf_ptrvec *v, size_t extra) {
    size_t need = v->len + extra;
    if (need <= v->cap) {
        return 0;
    }
    size_t cap = v->cap ? v->cap : 8;
    while (cap < need) {
        cap *= 2;   /* geometric growth: O(1) amortized per push */
    }
    void **items = (void **)realloc(v->items, cap * sizeof(void *));
    if (items == NULL) {
        return -1;
    }
    v->items = items;
    v->cap = cap;
    return 0;
}

/* The caller has reserved room. */
static inline void rf_ptrvec_push_unchecked(rf_ptrvec *v, void *p) {
    v->items[v->len++] = p;
}

static inline void rf_ptrvec_free(rf_ptrvec *v) {
    free(v->items);
    rf_ptrvec_init(v);
}

#endif
