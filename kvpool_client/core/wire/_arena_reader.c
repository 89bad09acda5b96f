/* A same-node read of one published block in one call: the compiled form of
 * kvpool_client.transport.shm's pure-Python path (PublishedReader.find, MappedArena.copy_held,
 * MarkWriter.mark), which stays the reference and the fallback where this does not build.
 *
 * The table, generations and marks layouts are those of kvpool_client.core.wire.published and
 * kvpool_client.core.wire.generations. A reader of a table entry (a seqlock: even seq, fields,
 * the same seq again) and of a slot generation (before the copy and after it) needs its loads
 * in program order, which x86-64 gives (the only platform the shm transport runs on); the
 * acquire loads below keep the compiler from moving them, and the copy, across each other.
 *
 * Copies whose destination lies a few bytes past the source modulo a page (a page-aligned slot
 * into a large numpy array, at a page plus 16) go through a loop of unaligned 16-byte loads and
 * aligned stores where the process measured memcpy clearly slower for them (glibc's memcpy takes
 * `rep movsb` for them, far slower on some CPUs; kvpool_client.core.channels.copy measures,
 * and says more); every other copy is a memcpy.
 *
 * The daemon reads its own table with the same type (locate, send): it answers a one-key GET
 * by sending the published slot's bytes to the client's socket while it holds the GIL. Every
 * write to a slot that was ever published follows the slot's free, which bumps its generation
 * and runs in Python: with the generation checked and the GIL held from that check until the
 * kernel has the bytes, no pin is needed. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define HEADER_WORDS 8
#define ENTRY_WORDS 8
enum { SEQ, DIGEST_LO, DIGEST_HI, OFFSET, LENGTH, CHECKSUM, GENERATION };
#define PAGE 4096
#define SHORT_DISTANCE 64 /* copy.SHORT_DISTANCE */
#define RELEASE_GIL_FROM (256 * 1024) /* bytes: below this, letting the GIL go costs more than it frees */

typedef struct {
    PyObject_HEAD
    Py_buffer table;       /* header and entries, u64 words, read-only */
    Py_buffer generations; /* one u64 per granule */
    Py_buffer arena;       /* the blocks */
    Py_buffer marks;       /* dirty words, then one mark per entry; writable */
    int held;              /* which buffers are held, for dealloc */
    int vector_near; /* copy blocks a few bytes past their slot modulo a page with the vector loop (else memcpy) */
    uint64_t mask, probe_limit, granule, slots, mark_first, mark_shift;
} ArenaReader;

static inline uint64_t load(const uint64_t *word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }

static void copy_block(char *dst, const char *src, size_t n, int vector_near) {
#if defined(__x86_64__)
    size_t distance = ((uintptr_t)dst - (uintptr_t)src) & (PAGE - 1); /* copy.short_page_distance */
    if (vector_near && distance != 0 && distance < SHORT_DISTANCE && n >= 4096) {
        size_t head = (size_t)(-(uintptr_t)dst & 15); /* up to the destination's 16-byte boundary */
        memcpy(dst, src, head);
        dst += head, src += head, n -= head;
        for (; n >= 64; dst += 64, src += 64, n -= 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)src), b = _mm_loadu_si128((const __m128i *)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + 32)), d = _mm_loadu_si128((const __m128i *)(src + 48));
            _mm_store_si128((__m128i *)dst, a), _mm_store_si128((__m128i *)(dst + 16), b);
            _mm_store_si128((__m128i *)(dst + 32), c), _mm_store_si128((__m128i *)(dst + 48), d);
        }
    }
#endif
    memcpy(dst, src, n);
}

/* The entry of the key whose digest is (low, high), read consistently; -1: none (not published,
 * being rewritten, or withdrawn). */
static Py_ssize_t find(const ArenaReader *self, uint64_t low, uint64_t high, uint64_t fields[7]) {
    const uint64_t *words = (const uint64_t *)self->table.buf;
    for (uint64_t step = 0; step < self->probe_limit; step++) {
        uint64_t index = (low + step) & self->mask;
        const uint64_t *entry = words + HEADER_WORDS + index * ENTRY_WORDS;
        uint64_t seq = load(entry + SEQ), found = load(entry + DIGEST_LO);
        if (!found) return -1; /* empty: the key lies in no later entry */
        if (found != low || load(entry + DIGEST_HI) != high) continue; /* another key, or a tombstone */
        for (int i = OFFSET; i <= GENERATION; i++) fields[i] = load(entry + i);
        if ((seq & 1) || load(entry + SEQ) != seq) return -1; /* the writer is at this entry */
        if (fields[LENGTH]) return (Py_ssize_t)index;
    }
    return -1;
}

/* Whether offset+length is a block of the arena; else a ValueError is set. */
static int is_slot(const ArenaReader *self, uint64_t offset, uint64_t length) {
    if (offset % self->granule || offset / self->granule >= self->slots || length > (uint64_t)self->arena.len ||
        offset > (uint64_t)self->arena.len - length) {
        PyErr_Format(PyExc_ValueError, "block at %llu+%llu is not a slot of the arena", (unsigned long long)offset,
                     (unsigned long long)length);
        return 0;
    }
    return 1;
}

static void mark(ArenaReader *self, Py_ssize_t slot, uint64_t tick) { /* the mark first, then its chunk's dirty word */
    uint64_t *marks = (uint64_t *)self->marks.buf;
    __atomic_store_n(marks + self->mark_first + slot, tick, __ATOMIC_RELEASE);
    __atomic_store_n(marks + ((uint64_t)slot >> self->mark_shift), 1, __ATOMIC_RELEASE);
}

static int holding(const ArenaReader *self) {
    if (self->held == 4) return 1;
    PyErr_SetString(PyExc_ValueError, "the reader holds no buffers (never initialized, or released)");
    return 0;
}

/* The writable spans a block is copied into: target itself, or each buffer of a tuple, in order.
 * Returns how many (into *spans, which is one when target is no tuple); -1 with an error set. */
static Py_ssize_t take_spans(PyObject *target, Py_buffer *one, Py_buffer **spans, Py_ssize_t *total) {
    const int flags = PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS;
    if (!PyTuple_Check(target)) {
        if (PyObject_GetBuffer(target, one, flags) < 0) return -1;
        *spans = one, *total = one->len;
        return 1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(target), sum = 0;
    Py_buffer *views = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Py_buffer));
    if (views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(target, i), &views[i], flags) < 0) {
            while (i--) PyBuffer_Release(&views[i]);
            PyMem_Free(views);
            return -1;
        }
        sum += views[i].len;
    }
    *spans = views, *total = sum;
    return count;
}

static void release_spans(Py_buffer *spans, Py_ssize_t count, Py_buffer *one) {
    for (Py_ssize_t i = 0; i < count; i++) PyBuffer_Release(&spans[i]);
    if (spans != one) PyMem_Free(spans);
}

static void copy_spans(Py_buffer *spans, Py_ssize_t count, const char *src, int vector_near) {
    for (Py_ssize_t i = 0; i < count; src += spans[i].len, i++) copy_block(spans[i].buf, src, spans[i].len, vector_near);
}

PyDoc_STRVAR(read_doc,
    "read(low, high, target, tick) -> (slot, offset, length, checksum, generation, copied) | None\n\n"
    "Find the key whose digest is (low, high) in the table and, when its slot's generation holds\n"
    "before and after, copy its block into target (exactly its length; a tuple of buffers takes the\n"
    "block span by span, in order) and mark the read at tick. copied is False when the generation\n"
    "moved or target's length differs; None: not published.\n"
    "Raises ValueError for an entry that is not a slot of the arena.");

static PyObject *ArenaReader_read(ArenaReader *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "read() takes low, high, target and tick");
        return NULL;
    }
    if (!holding(self)) return NULL;
    uint64_t low = PyLong_AsUnsignedLongLong(args[0]), high = PyLong_AsUnsignedLongLong(args[1]);
    uint64_t tick = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    uint64_t fields[7];
    Py_ssize_t slot = find(self, low, high, fields);
    if (slot < 0) Py_RETURN_NONE;
    uint64_t offset = fields[OFFSET], length = fields[LENGTH], generation = fields[GENERATION];
    if (!is_slot(self, offset, length)) return NULL;
    Py_buffer one, *spans;
    Py_ssize_t total, count = take_spans(args[2], &one, &spans, &total);
    if (count < 0) return NULL;
    const uint64_t *held = (const uint64_t *)self->generations.buf + offset / self->granule;
    int copied = 0;
    if ((uint64_t)total == length && load(held) == generation) {
        const char *src = (const char *)self->arena.buf + offset;
        if (length >= RELEASE_GIL_FROM) {
            Py_BEGIN_ALLOW_THREADS copy_spans(spans, count, src, self->vector_near);
            Py_END_ALLOW_THREADS
        } else {
            copy_spans(spans, count, src, self->vector_near);
        }
        copied = load(held) == generation;
    }
    release_spans(spans, count, &one);
    if (copied) mark(self, slot, tick);
    return Py_BuildValue("(nKKKKO)", slot, (unsigned long long)offset, (unsigned long long)length,
                         (unsigned long long)fields[CHECKSUM], (unsigned long long)generation,
                         copied ? Py_True : Py_False);
}

PyDoc_STRVAR(locate_doc,
    "locate(low, high, tick) -> (offset, length, checksum, generation) | None\n\n"
    "Find the key whose digest is (low, high) in the table and mark the read at tick (the daemon\n"
    "answering a GET of it). None: not published. Raises ValueError for an entry that is not a\n"
    "slot of the arena.");

static PyObject *ArenaReader_locate(ArenaReader *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "locate() takes low, high and tick");
        return NULL;
    }
    if (!holding(self)) return NULL;
    uint64_t low = PyLong_AsUnsignedLongLong(args[0]), high = PyLong_AsUnsignedLongLong(args[1]);
    uint64_t tick = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    uint64_t fields[7];
    Py_ssize_t slot = find(self, low, high, fields);
    if (slot < 0) Py_RETURN_NONE;
    if (!is_slot(self, fields[OFFSET], fields[LENGTH])) return NULL;
    mark(self, slot, tick);
    return Py_BuildValue("(KKKK)", (unsigned long long)fields[OFFSET], (unsigned long long)fields[LENGTH],
                         (unsigned long long)fields[CHECKSUM], (unsigned long long)fields[GENERATION]);
}

PyDoc_STRVAR(send_doc,
    "send(fd, head, offset, length, generation) -> bytes | None\n\n"
    "Send head, then the block at offset+length, to the non-blocking socket fd, if its slot's\n"
    "generation is still generation, holding the GIL throughout (see the module's comment).\n"
    "Returns what the socket did not take, copied (empty: all sent); None: the slot was freed\n"
    "since (nothing sent). Raises OSError when the send fails, ValueError for a place that is\n"
    "not a slot of the arena.");

static PyObject *ArenaReader_send(ArenaReader *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "send() takes fd, head, offset, length and generation");
        return NULL;
    }
    if (!holding(self)) return NULL;
    long fd = PyLong_AsLong(args[0]);
    uint64_t offset = PyLong_AsUnsignedLongLong(args[2]), length = PyLong_AsUnsignedLongLong(args[3]);
    uint64_t generation = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "%ld is not a file descriptor", fd);
        return NULL;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "send() takes the head as bytes");
        return NULL;
    }
    if (!is_slot(self, offset, length)) return NULL;
    if (load((const uint64_t *)self->generations.buf + offset / self->granule) != generation) Py_RETURN_NONE;
    const char *head = PyBytes_AS_STRING(args[1]), *block = (const char *)self->arena.buf + offset;
    size_t head_len = (size_t)PyBytes_GET_SIZE(args[1]);
    struct iovec parts[2] = {{(void *)head, head_len}, {(void *)block, length}};
    struct msghdr message = {.msg_iov = parts, .msg_iovlen = 2};
    ssize_t sent;
    do {
        sent = sendmsg((int)fd, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return PyErr_SetFromErrno(PyExc_OSError);
    size_t done = sent < 0 ? 0 : (size_t)sent, total = head_len + length;
    PyObject *rest = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total - done));
    if (rest == NULL) return NULL;
    char *out = PyBytes_AS_STRING(rest);
    if (done < head_len) { /* still under the GIL: the block's bytes cannot have changed */
        memcpy(out, head + done, head_len - done);
        memcpy(out + head_len - done, block, length);
    } else {
        memcpy(out, block + (done - head_len), total - done);
    }
    return rest;
}

static int get_words(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t need, const char *what) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len < need || ((uintptr_t)view->buf & 7)) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes at %p, need %zd, 8-byte aligned", what, view->len, view->buf,
                     need);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void release_all(ArenaReader *self) {
    Py_buffer *views[] = {&self->table, &self->generations, &self->arena, &self->marks};
    for (int i = 0; i < self->held; i++) PyBuffer_Release(views[i]);
    self->held = 0;
}

/* ArenaReader(table, generations, arena, marks, entries, probe_limit, granule, mark_first, mark_shift,
 *             vector_near) */
static int ArenaReader_init(ArenaReader *self, PyObject *args, PyObject *kwargs) {
    PyObject *table, *generations, *arena, *marks;
    unsigned long long entries, probe_limit, granule, mark_first, mark_shift;
    int vector_near;
    static char *names[] = {"table", "generations", "arena", "marks", "entries", "probe_limit", "granule",
                            "mark_first", "mark_shift", "vector_near", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOKKKKKp", names, &table, &generations, &arena, &marks,
                                     &entries, &probe_limit, &granule, &mark_first, &mark_shift, &vector_near))
        return -1;
    release_all(self);
    if (!entries || (entries & (entries - 1)) || !probe_limit || probe_limit > entries || !granule || mark_shift > 63) {
        PyErr_SetString(PyExc_ValueError, "entries must be a power of two, with a probe limit in 1..entries");
        return -1;
    }
    Py_ssize_t table_bytes = (Py_ssize_t)(8 * (HEADER_WORDS + entries * ENTRY_WORDS));
    if (get_words(table, &self->table, PyBUF_SIMPLE, table_bytes, "table") < 0) return -1;
    self->held = 1;
    if (get_words(generations, &self->generations, PyBUF_SIMPLE, 8, "generations") < 0) return -1;
    self->held = 2;
    if (PyObject_GetBuffer(arena, &self->arena, PyBUF_SIMPLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    self->held = 3;
    Py_ssize_t marks_bytes = (Py_ssize_t)(8 * (mark_first + entries));
    if (get_words(marks, &self->marks, PyBUF_WRITABLE, marks_bytes, "marks") < 0) return -1;
    self->held = 4;
    self->mask = entries - 1, self->probe_limit = probe_limit, self->granule = granule;
    self->slots = (uint64_t)self->generations.len / 8, self->mark_first = mark_first, self->mark_shift = mark_shift;
    self->vector_near = vector_near;
    return 0;
}

static PyObject *ArenaReader_release(ArenaReader *self, PyObject *Py_UNUSED(ignored)) {
    release_all(self);
    Py_RETURN_NONE;
}

static void ArenaReader_dealloc(ArenaReader *self) {
    release_all(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ArenaReader_methods[] = {
    {"read", (PyCFunction)(void (*)(void))ArenaReader_read, METH_FASTCALL, read_doc},
    {"locate", (PyCFunction)(void (*)(void))ArenaReader_locate, METH_FASTCALL, locate_doc},
    {"send", (PyCFunction)(void (*)(void))ArenaReader_send, METH_FASTCALL, send_doc},
    {"release", (PyCFunction)ArenaReader_release, METH_NOARGS, "Let go of the buffers (so their mappings can close)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ArenaReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvpool_client.core.wire._arena_reader.ArenaReader",
    .tp_basicsize = sizeof(ArenaReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reads published blocks out of a daemon's arena (see read()).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ArenaReader_init,
    .tp_dealloc = (destructor)ArenaReader_dealloc,
    .tp_methods = ArenaReader_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_arena_reader",
    .m_doc = "Same-node reads of published blocks.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__arena_reader(void) {
    if (PyType_Ready(&ArenaReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "ArenaReader", (PyObject *)&ArenaReaderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
