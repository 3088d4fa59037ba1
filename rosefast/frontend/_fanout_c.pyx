# cython: language_level=3
"""publish, compiled: the per-step loop runs in C and calls the collectors' C-level put directly."""
from cpython.list cimport PyList_Append, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport PyObject

from rosefast.frontend._collector_c cimport StreamOutputCollector

from rosefast.frontend._fanout_py import check_step, fail


cpdef list publish(list keys, list collectors, list token_ids, list texts, list finished=None,
                   list finish_reasons=None, list logprobs=None):
    cdef Py_ssize_t i, n = PyList_GET_SIZE(keys)
    cdef PyObject *fin
    cdef object key, item
    cdef StreamOutputCollector collector
    cdef list ready = []
    if PyList_GET_SIZE(collectors) != n or PyList_GET_SIZE(token_ids) != n or PyList_GET_SIZE(texts) != n \
            or (finished is not None and PyList_GET_SIZE(finished) != n) \
            or (finish_reasons is not None and PyList_GET_SIZE(finish_reasons) != n) \
            or (logprobs is not None and PyList_GET_SIZE(logprobs) != n):
        check_step(keys, collectors, token_ids, texts, finished, finish_reasons, logprobs)
    for i in range(n):
        # Python code may run inside the loop (a `finished` entry's __bool__, a subclass's conversion) and
        # change the lists: every read is checked against their size now.
        if i >= PyList_GET_SIZE(keys):
            break
        if i >= PyList_GET_SIZE(collectors) or i >= PyList_GET_SIZE(token_ids) or i >= PyList_GET_SIZE(texts) \
                or (finished is not None and i >= PyList_GET_SIZE(finished)) \
                or (finish_reasons is not None and i >= PyList_GET_SIZE(finish_reasons)) \
                or (logprobs is not None and i >= PyList_GET_SIZE(logprobs)):
            raise IndexError(f"publish: the step's lists shrank while entry {i} was published")
        key = <object>PyList_GET_ITEM(keys, i)
        item = <object>PyList_GET_ITEM(collectors, i)
        if type(item) is not StreamOutputCollector:
            raise TypeError(f"publish: collectors[{i}] is a {type(item).__name__}, not a StreamOutputCollector")
        collector = <StreamOutputCollector>item   # held: dropping the list's reference mid-put must not free it
        fin = <PyObject *>False if finished is None else PyList_GET_ITEM(finished, i)
        if fin != <PyObject *>True and fin != <PyObject *>False:
            # its truth may run Python code: the collector's Python-level put holds the fields first
            if collector.put(token_ids[i], texts[i], <object>fin,
                             None if finish_reasons is None else finish_reasons[i],
                             None if logprobs is None else logprobs[i]):
                PyList_Append(ready, key)
        elif collector._put(   # borrowed from the step's lists, which this call holds (the collector's
                # rare-type path takes its own references before it runs Python code)
                PyList_GET_ITEM(token_ids, i), PyList_GET_ITEM(texts, i), fin == <PyObject *>True,
                <PyObject *>None if finish_reasons is None else PyList_GET_ITEM(finish_reasons, i),
                <PyObject *>None if logprobs is None else PyList_GET_ITEM(logprobs, i)) == 1:
            PyList_Append(ready, key)
    return ready
