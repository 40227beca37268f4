/* The tracer's table of live tensors' producers, compiled: the same class as
   memcpy_doctor/tracer/producers.py's PyProducerTable (that module says what it does and
   picks one), for the per-op path, where the Python version costs about 6,000 instructions an
   op (about a fifth of a bare dispatch mode's overhead; see docs/benchmarks.md).

   An open-addressing hash table keyed by the tensor object's address. Each entry holds a weak
   reference to its tensor (the basic one, which CPython shares between its holders), so it
   holds only while that tensor lives: an address reused by a new object finds a dead entry
   and replaces it. Dead entries (and forgotten ones) are swept when the table fills, before
   it grows.

   Anything that can run Python code (a tensor's `nbytes`, an allocation that starts the
   garbage collector, and with it finalizers that may trace ops) can re-enter the table, so no
   pointer into the slots is held across such a call. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* slots in a new table (a power of two); the table doubles when half full of live entries */
#define INITIAL_SLOTS 64

typedef struct {
    PyObject *key;   /* the tensor's address, compared and never dereferenced; NULL: empty */
    PyObject *ref;   /* a weak reference to the tensor (strong reference to the weakref) */
    PyObject *value; /* what made the tensor's data (strong) */
    int64_t nbytes;  /* its size when the op that made it was a kernel; -1: not known */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *slots;
    Py_ssize_t mask; /* slots - 1 */
    Py_ssize_t used; /* entries, live or dead */
} Table;

static PyObject *str_nbytes;

static inline size_t slot_of(PyObject *key) {
    size_t h = (size_t)key >> 4; /* objects are 16-byte aligned */
    return h ^ (h >> 17);
}

/* The entry of key, or the empty slot where it would go (a table is never full). */
static inline Entry *find(Table *t, PyObject *key) {
    size_t i = slot_of(key) & (size_t)t->mask;
    for (;;) {
        Entry *e = &t->slots[i];
        if (e->key == key || e->key == NULL) {
            return e;
        }
        i = (i + 1) & (size_t)t->mask;
    }
}

/* The object a weak reference refers to (compared, never used), or NULL/None when dead.
   PyWeakref_GET_OBJECT, a plain read, is deprecated from Python 3.13 on. */
#if PY_VERSION_HEX >= 0x030D0000
static inline PyObject *referent(PyObject *ref) {
    PyObject *o;
    if (PyWeakref_GetRef(ref, &o) <= 0) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(o); /* alive elsewhere: only its address is compared */
    return o;
}
#else
#define referent(ref) PyWeakref_GET_OBJECT(ref)
#endif

static inline int is_live(const Entry *e, PyObject *key) {
    return e->key == key && referent(e->ref) == key;
}

/* Release the entries left in `slots` (moved ones have no key) and free them: called once
   the table no longer points at them, as a release can run code that uses the table. */
static void release(Entry *slots, Py_ssize_t n) {
    if (slots == NULL) {
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (slots[i].key != NULL) {
            Py_DECREF(slots[i].ref);
            Py_XDECREF(slots[i].value);
        }
    }
    PyMem_Free(slots);
}

/* Move the live entries to `n_slots` new slots; release the dead ones once the table is
   whole again. */
static int rebuild(Table *t, Py_ssize_t n_slots) {
    Entry *slots = PyMem_Calloc((size_t)n_slots, sizeof(Entry));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Entry *old = t->slots;
    Py_ssize_t old_n = t->mask + 1;
    t->slots = slots;
    t->mask = n_slots - 1;
    t->used = 0;
    for (Py_ssize_t i = 0; i < old_n; i++) {
        Entry *e = &old[i];
        if (e->key != NULL && e->value != NULL && referent(e->ref) == e->key) {
            *find(t, e->key) = *e;
            t->used++;
            e->key = NULL; /* moved */
        }
    }
    release(old, old_n);
    return 0;
}

/* Record that `value` made o's data, and o's size (-1: not known). */
static int put(Table *t, PyObject *o, PyObject *value, int64_t nbytes) {
    PyObject *ref = PyWeakref_NewRef(o, NULL); /* o's existing basic reference, if any */
    if (ref == NULL) {
        return -1;
    }
    Entry *e = find(t, o);
    if (e->key == NULL) {
        if ((t->used + 1) * 2 > t->mask + 1) {
            Py_ssize_t n_slots = t->mask + 1;
            if (rebuild(t, n_slots) < 0) { /* the dead swept first */
                Py_DECREF(ref);
                return -1;
            }
            if ((t->used + 1) * 4 > n_slots && rebuild(t, 2 * n_slots) < 0) {
                Py_DECREF(ref);
                return -1;
            }
            e = find(t, o);
        }
        if (e->key == NULL) {
            e->key = o;
            e->ref = NULL;
            e->value = NULL;
            t->used++;
        }
    }
    PyObject *old_ref = e->ref, *old_value = e->value;
    e->ref = ref;
    Py_INCREF(value);
    e->value = value;
    e->nbytes = nbytes;
    Py_XDECREF(old_ref); /* after the entry is whole: a release may run code */
    Py_XDECREF(old_value);
    return 0;
}

/* o.nbytes (0 for a sparse tensor, which has none), or -2 with an exception set */
static int64_t nbytes_of(PyObject *o) {
    PyObject *n = PyObject_GetAttr(o, str_nbytes);
    if (n == NULL) {
        if (PyErr_ExceptionMatches(PyExc_RuntimeError)) { /* rare: only then ask why */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyObject *sparse = PyObject_GetAttrString(o, "is_sparse");
            int is_sparse = sparse != NULL && PyObject_IsTrue(sparse) == 1;
            Py_XDECREF(sparse);
            if (is_sparse) {
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(tb);
                PyErr_Clear();
                return 0;
            }
            PyErr_Clear();
            PyErr_Restore(type, value, tb);
        }
        return -2;
    }
    int64_t v = PyLong_AsLongLong(n);
    Py_DECREF(n);
    if (v == -1 && PyErr_Occurred()) {
        return -2;
    }
    return v;
}

/* edge[i] += add, for an edge [reads, bytes] */
static int add_to(PyObject *edge, Py_ssize_t i, int64_t add) {
    int64_t now = PyLong_AsLongLong(PyList_GET_ITEM(edge, i));
    if (now == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *sum = PyLong_FromLongLong(now + add);
    if (sum == NULL) {
        return -1;
    }
    PyList_SetItem(edge, i, sum);
    return 0;
}

/* The tensors (a new reference to a tuple or list) and the truth of `kernel` of a call
   read(ins, flows_in, kernel) or write(outs, producer, kernel); NULL with an exception set. */
static PyObject *tensors_and_kernel(PyObject *const *args, Py_ssize_t nargs, const char *usage,
                                    int *kernel) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if ((*kernel = PyObject_IsTrue(args[2])) < 0) {
        return NULL;
    }
    return PySequence_Fast(args[0], usage);
}

PyDoc_STRVAR(read_doc,
"read(ins, flows_in, kernel) -> bytes read\n\n"
"For each input whose producer is known, add a read and its bytes to flows_in[producer]\n"
"(an edge [reads, bytes], made if missing). The bytes read: the known inputs' sizes, and\n"
"with `kernel` the others' too.");

static PyObject *Table_read(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    int kernel;
    PyObject *seq = tensors_and_kernel(args, nargs, "read(ins, flows_in, kernel)", &kernel);
    if (seq == NULL) {
        return NULL;
    }
    PyObject *flows = args[1];
    if (!PyDict_Check(flows)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_TypeError, "flows_in must be a dict");
        return NULL;
    }
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
        Entry *e = find(t, x);
        if (!is_live(e, x) || e->value == NULL) {
            if (kernel) {
                int64_t size = nbytes_of(x);
                if (size == -2) {
                    goto error;
                }
                total += size;
            }
            continue;
        }
        PyObject *made_by = e->value;
        int64_t size = e->nbytes;
        Py_INCREF(made_by); /* e is not used past here */
        if (size < 0 && (size = nbytes_of(x)) == -2) {
            Py_DECREF(made_by);
            goto error;
        }
        PyObject *edge = PyDict_GetItemWithError(flows, made_by);
        if (edge != NULL) {
            Py_INCREF(edge);
        } else if (PyErr_Occurred()
                   || (edge = Py_BuildValue("[ii]", 0, 0)) == NULL
                   || PyDict_SetItem(flows, made_by, edge) < 0) {
            Py_XDECREF(edge);
            Py_DECREF(made_by);
            goto error;
        }
        Py_DECREF(made_by);
        int failed = add_to(edge, 0, 1) < 0 || add_to(edge, 1, size) < 0;
        Py_DECREF(edge);
        if (failed) {
            goto error;
        }
        total += size;
    }
    Py_DECREF(seq);
    return PyLong_FromLongLong(total);
error:
    Py_DECREF(seq);
    return NULL;
}

PyDoc_STRVAR(write_doc,
"write(outs, producer, kernel) -> bytes written\n\n"
"Record that `producer` made each output; with `kernel`, also each one's size (the bytes\n"
"written, returned; 0 without `kernel`).");

static PyObject *Table_write(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    int kernel;
    PyObject *seq = tensors_and_kernel(args, nargs, "write(outs, producer, kernel)", &kernel);
    if (seq == NULL) {
        return NULL;
    }
    PyObject *producer = args[1];
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        int64_t size = -1;
        if (kernel) {
            if ((size = nbytes_of(o)) == -2) {
                goto error;
            }
            total += size;
        }
        if (put(t, o, producer, size) < 0) {
            goto error;
        }
    }
    Py_DECREF(seq);
    return PyLong_FromLongLong(total);
error:
    Py_DECREF(seq);
    return NULL;
}

PyDoc_STRVAR(get_doc, "get(t) -> what made t's data, or None");

static PyObject *Table_get(Table *t, PyObject *o) {
    Entry *e = find(t, o);
    if (is_live(e, o) && e->value != NULL) {
        return Py_NewRef(e->value);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(forget_doc, "forget(t): t's data was made by no op the table knows of");

static PyObject *Table_forget(Table *t, PyObject *o) {
    Entry *e = find(t, o);
    if (e->key == o) {  /* (the entry stays, answering nothing, until swept or rewritten) */
        PyObject *value = e->value;
        e->value = NULL;
        e->nbytes = -1;
        Py_XDECREF(value);
    }
    Py_RETURN_NONE;
}

/* Empty the table; release its entries once it is consistent again. */
static int release_all(Table *t) {
    Entry *slots = PyMem_Calloc(INITIAL_SLOTS, sizeof(Entry));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Entry *old = t->slots;
    Py_ssize_t old_n = t->mask + 1;
    t->slots = slots;
    t->mask = INITIAL_SLOTS - 1;
    t->used = 0;
    release(old, old_n);
    return 0;
}

PyDoc_STRVAR(clear_doc, "clear(): forget every entry");

static PyObject *Table_clear(Table *t, PyObject *Py_UNUSED(ignored)) {
    if (release_all(t) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Table_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) > 1 || (kwds != NULL && PyDict_GET_SIZE(kwds) > 0)) {
        PyErr_SetString(PyExc_TypeError, "ProducerTable(sweep_min=None)");
        return NULL;
    }
    Table *t = (Table *)type->tp_alloc(type, 0);
    if (t == NULL) {
        return NULL;
    }
    /* (sweep_min is the Python version's: this one sweeps as it fills) */
    if (release_all(t) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static int Table_traverse(Table *t, visitproc visit, void *arg) {
    if (t->slots == NULL) { /* cleared, or not yet set up */
        return 0;
    }
    for (Py_ssize_t i = 0; i <= t->mask; i++) {
        if (t->slots[i].key != NULL) {
            Py_VISIT(t->slots[i].value);
        }
    }
    return 0;
}

static int Table_tp_clear(Table *t) {
    Entry *old = t->slots;
    Py_ssize_t old_n = t->mask + 1;
    t->slots = NULL;
    t->mask = -1;
    t->used = 0;
    release(old, old_n);
    return 0;
}

static void Table_dealloc(Table *t) {
    PyObject_GC_UnTrack(t);
    Table_tp_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t Table_len(Table *t) {
    return t->used;
}

static PyMethodDef Table_methods[] = {
    {"read", (PyCFunction)(void (*)(void))Table_read, METH_FASTCALL, read_doc},
    {"write", (PyCFunction)(void (*)(void))Table_write, METH_FASTCALL, write_doc},
    {"get", (PyCFunction)Table_get, METH_O, get_doc},
    {"forget", (PyCFunction)Table_forget, METH_O, forget_doc},
    {"clear", (PyCFunction)Table_clear, METH_NOARGS, clear_doc},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Table_as_sequence = {
    .sq_length = (lenfunc)Table_len,
};

PyDoc_STRVAR(Table_doc,
"ProducerTable(sweep_min=None): a weak map from live tensors to the op that made each one\n"
"and its size when known. len() counts entries, live and dead (dead ones are swept when\n"
"the table fills).");

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memcpy_doctor.tracer._producers.ProducerTable",
    .tp_doc = Table_doc,
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Table_new,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_traverse = (traverseproc)Table_traverse,
    .tp_clear = (inquiry)Table_tp_clear,
    .tp_methods = Table_methods,
    .tp_as_sequence = &Table_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "memcpy_doctor.tracer._producers",
    .m_doc = "The compiled table of live tensors' producers (see producers.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__producers(void) {
    str_nbytes = PyUnicode_InternFromString("nbytes");
    if (str_nbytes == NULL || PyType_Ready(&TableType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "ProducerTable", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
