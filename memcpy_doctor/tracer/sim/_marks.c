/* The simulated GPU's storage marks, compiled: the core of marks.py's StorageMarks (that
   module says what the marks are and picks this or its Python version, _PyMarksCore).

   Each new device storage gets a weak reference whose callback forgets the storage and takes
   its bytes off the allocated total when torch frees it. In Python that callback cost about
   2,000 instructions a freed storage, and making the reference (a slotted subclass of
   weakref.ref, through its Python constructor) and the call to `add_new` about 1,000 more,
   on every op that makes a new device tensor (docs/benchmarks.md, "The simulated GPU's
   cost"). Here the reference is a C subclass of weakref.ref that carries the storage's key
   and size, made without the Python constructor, and the callback is a C method.

   The table itself stays a plain dict (`refs`: id(storage) -> reference), as in the Python
   version, which the rest of the simulated GPU reads; the per-op path asks `inputs` and
   `mark_outputs`, one call an op each, instead of a loop of its own. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* A weak reference to a marked storage, with the dict key it is filed under and its size. */
typedef struct {
    PyWeakReference ref;
    PyObject *key;    /* id(storage) as an int (strong); NULL until filed */
    Py_ssize_t nbytes;
} MarkRef;

static void MarkRef_dealloc(MarkRef *self) {
    Py_CLEAR(self->key);
    _PyWeakref_RefType.tp_dealloc((PyObject *)self);
}

static PyMemberDef MarkRef_members[] = {
    {"key", T_OBJECT, offsetof(MarkRef, key), READONLY, "id() of the marked storage"},
    {"nbytes", T_PYSSIZET, offsetof(MarkRef, nbytes), READONLY, "its size in bytes"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MarkRefType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memcpy_doctor.tracer.sim._marks.MarkRef",
    .tp_doc = "A weak reference to a marked storage, with its key and size.",
    .tp_basicsize = sizeof(MarkRef),
    /* no Py_TPFLAGS_HAVE_GC here: PyType_Ready sets it, with weakref's traverse and clear
       (the key is an int, which holds nothing to traverse) */
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)MarkRef_dealloc,
    .tp_members = MarkRef_members,
};

typedef struct {
    PyObject_HEAD
    PyObject *refs;    /* id(storage) -> MarkRef */
    PyObject *on_free; /* this object's bound `_drop`: one for all its references */
    Py_ssize_t allocated;
    Py_ssize_t peak;
} Marks;

static PyObject *str_nbytes, *str_drop, *str_untyped_storage;

static PyObject *Marks_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Marks *self = (Marks *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->refs = PyDict_New();
    if (self->refs == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int Marks_init(Marks *self, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "StorageMarks() takes no arguments");
        return -1;
    }
    PyObject *on_free = PyObject_GetAttr((PyObject *)self, str_drop);
    if (on_free == NULL) {
        return -1;
    }
    Py_XSETREF(self->on_free, on_free);
    return 0;
}

PyDoc_STRVAR(drop_doc,
"_drop(ref): forget the storage of `ref` (a reference this table made) if it is still\n"
"filed under its key, and take its bytes off `allocated`. The references' callback.");

static PyObject *Marks_drop(Marks *self, PyObject *ref) {
    if (!PyObject_TypeCheck(ref, &MarkRefType)) {
        PyErr_SetString(PyExc_TypeError, "_drop() takes a reference made by add_new()");
        return NULL;
    }
    MarkRef *mark = (MarkRef *)ref;
    if (mark->key == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *filed = PyDict_GetItemWithError(self->refs, mark->key); /* borrowed */
    if (filed == ref) {
        Py_ssize_t nbytes = mark->nbytes;
        if (PyDict_DelItem(self->refs, mark->key) < 0) { /* (may free `mark`) */
            return NULL;
        }
        self->allocated -= nbytes;
    }
    else if (filed == NULL && PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(add_new_doc,
"add_new(storage, key): mark a storage known to be unmarked, whose id is `key` (the\n"
"per-op path has looked it up already); counts its bytes into `allocated` and `peak`.");

/* Mark `storage`, filed under `key`; 0, or -1 with an exception set. */
static int mark(Marks *self, PyObject *storage, PyObject *key) {
    if (self->on_free == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StorageMarks was not initialized");
        return -1;
    }
    PyObject *size = PyObject_CallMethodNoArgs(storage, str_nbytes);
    if (size == NULL) {
        return -1;
    }
    Py_ssize_t nbytes = PyLong_AsSsize_t(size);
    Py_DECREF(size);
    if (nbytes == -1 && PyErr_Occurred()) {
        return -1;
    }
    /* weakref's own constructor, without the type call's argument parsing for __init__ */
    PyObject *pair = PyTuple_Pack(2, storage, self->on_free);
    if (pair == NULL) {
        return -1;
    }
    PyObject *ref = MarkRefType.tp_new(&MarkRefType, pair, NULL);
    Py_DECREF(pair);
    if (ref == NULL) {
        return -1;
    }
    MarkRef *mark = (MarkRef *)ref;
    Py_INCREF(key);
    mark->key = key;
    mark->nbytes = nbytes;
    int failed = PyDict_SetItem(self->refs, key, ref);
    Py_DECREF(ref);
    if (failed) {
        return -1;
    }
    Py_ssize_t allocated = self->allocated += nbytes;
    if (allocated > self->peak) {
        self->peak = allocated;
    }
    return 0;
}

static PyObject *Marks_add_new(Marks *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add_new() takes a storage and its key");
        return NULL;
    }
    if (mark(self, args[0], args[1]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* t.untyped_storage(), or NULL with no exception set for a tensor without one (sparse,
   nested, storage-less: what marks.NO_STORAGE lists), or NULL with another exception. */
static PyObject *storage_of(PyObject *t) {
    PyObject *storage = PyObject_CallMethodNoArgs(t, str_untyped_storage);
    if (storage == NULL && (PyErr_ExceptionMatches(PyExc_RuntimeError) ||
                            PyErr_ExceptionMatches(PyExc_NotImplementedError) ||
                            PyErr_ExceptionMatches(PyExc_TypeError))) {
        PyErr_Clear();
    }
    return storage;
}

PyDoc_STRVAR(inputs_doc,
"inputs(tensors): a list with, for each tensor, whether its storage is marked (False for\n"
"a tensor without a storage). The per-op path's question about an op's inputs.");

static PyObject *Marks_inputs(Marks *self, PyObject *tensors) {
    PyObject *seq = PySequence_Fast(tensors, "inputs() takes a sequence of tensors");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *storage = storage_of(PySequence_Fast_GET_ITEM(seq, i));
        int marked = 0;
        if (storage != NULL) {
            PyObject *key = PyLong_FromVoidPtr(storage);
            Py_DECREF(storage);
            marked = key == NULL ? -1 : PyDict_Contains(self->refs, key);
            Py_XDECREF(key);
        }
        else if (PyErr_Occurred()) {
            marked = -1;
        }
        if (marked < 0) {
            Py_CLEAR(out);
            break;
        }
        PyObject *answer = marked ? Py_True : Py_False;
        Py_INCREF(answer);
        PyList_SET_ITEM(out, i, answer);
    }
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(mark_outputs_doc,
"mark_outputs(tensors): mark the storages of these tensors (an op's outputs on the\n"
"device) that are not marked yet: new ones, not views or in-place results.");

static PyObject *Marks_mark_outputs(Marks *self, PyObject *tensors) {
    PyObject *seq = PySequence_Fast(tensors, "mark_outputs() takes a sequence of tensors");
    if (seq == NULL) {
        return NULL;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *storage = storage_of(PySequence_Fast_GET_ITEM(seq, i));
        if (storage == NULL) {
            failed = PyErr_Occurred() != NULL;
            continue;
        }
        PyObject *key = PyLong_FromVoidPtr(storage);
        int known = key == NULL ? -1 : PyDict_Contains(self->refs, key);
        failed = known < 0 || (!known && mark(self, storage, key) < 0);
        Py_XDECREF(key);
        Py_DECREF(storage);
    }
    Py_DECREF(seq);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static int Marks_traverse(Marks *self, visitproc visit, void *arg) {
    Py_VISIT(self->refs);
    Py_VISIT(self->on_free);
    return 0;
}

static int Marks_clear(Marks *self) {
    Py_CLEAR(self->refs);
    Py_CLEAR(self->on_free);
    return 0;
}

static void Marks_dealloc(Marks *self) {
    PyObject_GC_UnTrack(self);
    Marks_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Marks_methods[] = {
    {"add_new", (PyCFunction)(void (*)(void))Marks_add_new, METH_FASTCALL, add_new_doc},
    {"_drop", (PyCFunction)Marks_drop, METH_O, drop_doc},
    {"inputs", (PyCFunction)Marks_inputs, METH_O, inputs_doc},
    {"mark_outputs", (PyCFunction)Marks_mark_outputs, METH_O, mark_outputs_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Marks_members[] = {
    {"refs", T_OBJECT, offsetof(Marks, refs), READONLY, "id(storage) -> its reference"},
    {"allocated", T_PYSSIZET, offsetof(Marks, allocated), 0, "bytes of the marked storages"},
    {"peak", T_PYSSIZET, offsetof(Marks, peak), 0, "the most `allocated` has been"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MarksType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memcpy_doctor.tracer.sim._marks.MarksCore",
    .tp_doc = "The storage marks' table, sizes and callback (see marks.py).",
    .tp_basicsize = sizeof(Marks),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = Marks_new,
    .tp_init = (initproc)Marks_init,
    .tp_dealloc = (destructor)Marks_dealloc,
    .tp_traverse = (traverseproc)Marks_traverse,
    .tp_clear = (inquiry)Marks_clear,
    .tp_methods = Marks_methods,
    .tp_members = Marks_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "memcpy_doctor.tracer.sim._marks",
    .m_doc = "The compiled core of the simulated GPU's storage marks (see marks.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__marks(void) {
    str_nbytes = PyUnicode_InternFromString("nbytes");
    str_drop = PyUnicode_InternFromString("_drop");
    str_untyped_storage = PyUnicode_InternFromString("untyped_storage");
    if (str_nbytes == NULL || str_drop == NULL || str_untyped_storage == NULL) {
        return NULL;
    }
    MarkRefType.tp_base = &_PyWeakref_RefType;
    if (PyType_Ready(&MarkRefType) < 0 || PyType_Ready(&MarksType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "MarksCore", (PyObject *)&MarksType) < 0 ||
            PyModule_AddObjectRef(m, "MarkRef", (PyObject *)&MarkRefType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
