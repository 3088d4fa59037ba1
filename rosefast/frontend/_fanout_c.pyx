# cython: language_level=3
"""FanOut, compiled: the per-step loop runs in C and calls the collectors' C-level put directly."""
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_Append, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport PyObject

from rosefast.frontend._collector_c cimport StreamOutputCollector

from rosefast.frontend._fanout_py import check_new, check_step, fail_streams


cdef class FanOut:
    cdef dict _collectors
    cdef public Py_ssize_t dropped

    collector_type = StreamOutputCollector

    def __init__(self):
        self._collectors = {}
        self.dropped = 0

    def register(self, request_id):
        check_new(self._collectors, request_id)
        collector = StreamOutputCollector()
        self._collectors[request_id] = collector
        return collector

    def unregister(self, request_id):
        """Forget a request (finished or aborted); its collector, or None if it was not registered."""
        return self._collectors.pop(request_id, None)

    def get(self, request_id):
        return self._collectors.get(request_id)

    def __contains__(self, request_id):
        return request_id in self._collectors

    def __len__(self):
        return len(self._collectors)

    cpdef list publish(self, list request_ids, list token_ids, list texts, list finished=None,
                       list finish_reasons=None):
        cdef Py_ssize_t i, n = PyList_GET_SIZE(request_ids)
        cdef PyObject *found
        cdef PyObject *fin
        cdef object rid
        cdef StreamOutputCollector collector
        cdef list ready = []
        if PyList_GET_SIZE(token_ids) != n or PyList_GET_SIZE(texts) != n \
                or (finished is not None and PyList_GET_SIZE(finished) != n) \
                or (finish_reasons is not None and PyList_GET_SIZE(finish_reasons) != n):
            check_step(request_ids, token_ids, texts, finished, finish_reasons)
        for i in range(n):
            # Python code may run inside the loop (a request id's __eq__, a `finished` entry's __bool__, a
            # subclass's conversion) and change the lists: every read is checked against their size now.
            if i >= PyList_GET_SIZE(request_ids):
                break
            rid = <object>PyList_GET_ITEM(request_ids, i)
            found = PyDict_GetItem(self._collectors, rid)
            if found is NULL:
                self.dropped += 1
                continue
            collector = <StreamOutputCollector>found   # held: unregistering it mid-put must not free it
            if i >= PyList_GET_SIZE(token_ids) or i >= PyList_GET_SIZE(texts) \
                    or (finished is not None and i >= PyList_GET_SIZE(finished)) \
                    or (finish_reasons is not None and i >= PyList_GET_SIZE(finish_reasons)):
                raise IndexError(f"publish: the step's lists shrank while entry {i} was published")
            fin = <PyObject *>False if finished is None else PyList_GET_ITEM(finished, i)
            if fin != <PyObject *>True and fin != <PyObject *>False:
                # its truth may run Python code: the collector's Python-level put holds the fields first
                if collector.put(token_ids[i], texts[i], <object>fin,
                                 None if finish_reasons is None else finish_reasons[i]):
                    PyList_Append(ready, rid)
            elif collector._put(   # borrowed from the step's lists, which this call holds (the collector's
                    # rare-type path takes its own references before it runs Python code)
                    PyList_GET_ITEM(token_ids, i), PyList_GET_ITEM(texts, i), fin == <PyObject *>True,
                    <PyObject *>None if finish_reasons is None else PyList_GET_ITEM(finish_reasons, i)) == 1:
                PyList_Append(ready, rid)
        return ready

    def publish_error(self, request_ids, exc):
        return fail_streams(self._collectors, request_ids, exc)
