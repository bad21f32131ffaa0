// memory.cpp — tinylearn._C.memory: Python bindings of the allocators in memory/*.h.
//
// Classes (each mirrors tinylearn/memory/<name>.py; same offsets for the same trace):
//   Bump(capacity, alignment)                FreeList(capacity, alignment, best_fit)
//   Buddy(capacity, min_block)               Slab(sizes, capacity, slab_size, alignment)
//   Caching(capacity, round_to, small_size, small_buffer, large_buffer, min_large_alloc, round_large,
//           max_split_size)  -- thread-safe; malloc/free/replay release the GIL
// Common methods: malloc(nbytes) -> offset, free(offset), stats() -> dict, block_size(offset),
//   live_blocks(), free_blocks(), arena() -> uint8 numpy view of the C++-owned block (keeps the object alive),
//   replay(ops int64[m, 2]) -> (offsets int64[n_malloc], seconds): the whole trace in a C++ loop, timed in C++.
// Plus malloc_replay(ops) -> seconds: the same loop over glibc malloc/free (the in-C++ baseline).
// numpy data-memory handlers (NEP 49, numpy >= 1.22): numpy_handler(caching) -> capsule routes numpy's array data
//   allocations to a Caching allocator (falling back to malloc when it is out of memory); counting_numpy_handler()
//   forwards to malloc/free and only counts (the unpooled baseline); set_numpy_handler(capsule|None) -> previous;
//   handler_stats(capsule) -> dict(n_malloc, n_free, n_fallback, n_system); recording_numpy_handler() +
//   handler_trace(capsule) -> int64 [m, 2] record the allocation trace of everything numpy allocates. The handler
//   structs below mirror numpy's PyDataMem_Handler (version 1); PyDataMem_SetHandler is slot 304 of numpy's C-API
//   table.
// Errors: ValueError (std::invalid_argument) / MemoryError (tl::mem::OutOfMemory, registered below).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "memory/base.h"
#include "memory/buddy.h"
#include "memory/bump.h"
#include "memory/caching.h"
#include "memory/freelist.h"
#include "memory/slab.h"
#include "memory/trace.h"
#include "registry.h"

namespace py = pybind11;
using tl::mem::i64;

namespace {

py::dict stats_dict(const tl::mem::Stats& s, bool caching) {
  py::dict d;
  d["capacity"] = s.capacity;
  d["allocated"] = s.allocated;
  d["requested"] = s.requested;
  d["reserved"] = s.reserved;
  if (caching) d["active"] = s.allocated;
  d["peak"] = s.peak;
  d["peak_reserved"] = s.peak_reserved;
  d["n_alloc"] = s.n_alloc;
  d["n_free"] = s.n_free;
  d["n_live"] = s.n_live;
  d["total_free"] = s.total_free;
  d["largest_free"] = s.largest_free;
  d["fragmentation"] = s.fragmentation();
  d["internal_fragmentation"] = s.internal_fragmentation();
  if (caching) {
    d["segments"] = s.segments;
    d["n_segment_alloc"] = s.n_segment_alloc;
    d["n_segment_free"] = s.n_segment_free;
    d["num_alloc_retries"] = s.num_alloc_retries;
    d["num_ooms"] = s.num_ooms;
    d["inactive_split"] = s.inactive_split;
  }
  return d;
}

using Ops = py::array_t<i64, py::array::c_style | py::array::forcecast>;

const i64* ops_ptr(const Ops& ops, i64& m) {
  if (ops.ndim() != 2 || ops.shape(1) != 2)
    tl::value_error("ops: expected an int64 array of shape [m, 2], got ndim " + std::to_string(ops.ndim()));
  m = ops.shape(0);
  return ops.data();
}

// Run a trace through `a` in C++; the timer brackets only the loop.
template <class A, class MallocFn, class FreeFn>
py::tuple replay_impl(A& a, const Ops& ops, bool release_gil, MallocFn mf, FreeFn ff) {
  i64 m = 0;
  const i64* p = ops_ptr(ops, m);
  i64 n = tl::mem::count_mallocs(p, m);
  py::array_t<i64> out(n);
  i64* o = out.mutable_data();
  double secs;
  {
    std::unique_ptr<py::gil_scoped_release> rel;
    if (release_gil) rel = std::make_unique<py::gil_scoped_release>();
    auto t0 = std::chrono::steady_clock::now();
    tl::mem::run_ops(
        p, m, o, [&](i64 nb) { return mf(a, nb); }, [&](i64 off) { ff(a, off); });
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return py::make_tuple(out, secs);
}

template <class A, class Cls>
void bind_common(Cls& cls, bool caching) {
  cls.def_property_readonly("capacity", &A::capacity)
      .def_property_readonly("alignment", &A::alignment)
      .def(
          "stats", [caching](A& a) { return stats_dict(a.stats(), caching); }, "counters and metrics (dict)")
      .def("block_size", &A::block_size, py::arg("offset"))
      .def("live_blocks", &A::live_blocks, "[(offset, size, requested)] sorted by offset")
      .def("free_blocks", &A::free_blocks, "[(offset, size)] sorted by offset")
      .def(
          "arena",
          [](py::object self) {
            A& a = self.cast<A&>();
            return py::array_t<uint8_t>({a.capacity()}, {i64(1)}, a.data(), self);
          },
          "uint8 numpy array over the arena owned by this object");
}

template <class A, class Cls>
void bind_simple(Cls& cls) {
  bind_common<A>(cls, false);
  cls.def("malloc", &A::malloc, py::arg("nbytes"), "allocate nbytes; returns the offset")
      .def("free", &A::free, py::arg("offset"), "free the block at offset")
      .def(
          "replay",
          [](A& a, const Ops& ops) {
            return replay_impl(
                a, ops, false, [](A& x, i64 nb) { return x.malloc(nb); }, [](A& x, i64 off) { x.free(off); });
          },
          py::arg("ops"), "run a trace in C++: (offsets, seconds)");
}

double malloc_replay(const Ops& ops) {
  i64 m = 0;
  const i64* p = ops_ptr(ops, m);
  i64 n = tl::mem::count_mallocs(p, m);
  std::vector<void*> ptrs(size_t(n) + 1);
  py::gil_scoped_release rel;
  auto t0 = std::chrono::steady_clock::now();
  i64 k = 0;
  for (i64 r = 0; r < m; ++r) {
    if (p[2 * r] == 0) {
      void* q = std::malloc(size_t(p[2 * r + 1]));
      if (!q) throw std::bad_alloc();
      ptrs[size_t(k++)] = q;  // stored: the compiler cannot elide the malloc/free pair
    } else {
      std::free(ptrs[size_t(p[2 * r + 1])]);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile void* sink = ptrs[0];
  (void)sink;
  return secs;
}

// ---- numpy data-memory handler ---------------------------------------------------------------------------------
struct NpyAllocator {
  void* ctx;
  void* (*malloc)(void* ctx, size_t size);
  void* (*calloc)(void* ctx, size_t nelem, size_t elsize);
  void* (*realloc)(void* ctx, void* ptr, size_t new_size);
  void (*free)(void* ctx, void* ptr, size_t size);
};
struct NpyHandler {
  char name[127];
  uint8_t version;
  NpyAllocator allocator;
};

struct HandlerCtx {
  tl::mem::Caching* alloc = nullptr;  // nullptr: counting handler (plain malloc/free)
  PyObject* owner = nullptr;          // strong reference to the Python object owning `alloc`
  uint8_t* base = nullptr;
  i64 cap = 0;
  std::atomic<i64> n_malloc{0}, n_free{0}, n_fallback{0}, n_system{0};
  NpyHandler handler{};
  // recording handler: trace rows (0, nbytes) / (1, malloc index), see tinylearn/memory/trace.py
  bool record = false;
  std::mutex rec_mu;
  std::vector<i64> trace;
  std::unordered_map<void*, i64> index;
  i64 n_traced = 0;

  void log_malloc(void* p, size_t n) {
    if (!record || p == nullptr) return;
    std::lock_guard<std::mutex> g(rec_mu);
    trace.push_back(0);
    trace.push_back(std::max<i64>(i64(n), 1));
    index[p] = n_traced++;
  }
  void log_free(void* p) {
    if (!record) return;
    std::lock_guard<std::mutex> g(rec_mu);
    auto it = index.find(p);
    if (it == index.end()) return;  // allocated before recording started
    trace.push_back(1);
    trace.push_back(it->second);
    index.erase(it);
  }

  bool owns(void* p) const {
    auto* q = static_cast<uint8_t*>(p);
    return alloc != nullptr && q >= base && q < base + cap;
  }
};

void* h_malloc_impl(HandlerCtx* c, size_t size) {
  c->n_malloc++;
  if (c->alloc) {
    try {
      return c->base + c->alloc->malloc(std::max<i64>(i64(size), 1), 0);
    } catch (...) {
      c->n_fallback++;
    }
  }
  c->n_system++;
  return std::malloc(size ? size : 1);
}
void* h_malloc(void* ctx, size_t size) {
  auto* c = static_cast<HandlerCtx*>(ctx);
  void* p = h_malloc_impl(c, size);
  c->log_malloc(p, size);
  return p;
}
void* h_calloc(void* ctx, size_t n, size_t e) {
  void* p = h_malloc(ctx, n * e);
  if (p) std::memset(p, 0, n * e);
  return p;
}
void h_free(void* ctx, void* p, size_t) {
  auto* c = static_cast<HandlerCtx*>(ctx);
  if (p == nullptr) return;
  c->n_free++;
  c->log_free(p);
  if (c->owns(p)) {
    c->alloc->free(static_cast<uint8_t*>(p) - c->base);
  } else {
    std::free(p);
  }
}
void* h_realloc(void* ctx, void* p, size_t n) {
  auto* c = static_cast<HandlerCtx*>(ctx);
  if (p == nullptr) return h_malloc(ctx, n);
  if (!c->owns(p)) {
    c->n_system++;
    c->log_free(p);
    void* q = std::realloc(p, n ? n : 1);
    c->log_malloc(q, n);
    return q;
  }
  i64 old = c->alloc->requested_size(static_cast<uint8_t*>(p) - c->base);
  void* q = h_malloc(ctx, n);
  if (q) {
    std::memcpy(q, p, size_t(std::min<i64>(old, i64(n))));
    h_free(ctx, p, size_t(old));
  }
  return q;
}

void capsule_destructor(PyObject* cap) {
  auto* h = static_cast<NpyHandler*>(PyCapsule_GetPointer(cap, "mem_handler"));
  if (h == nullptr) {
    PyErr_Clear();
    return;
  }
  auto* c = static_cast<HandlerCtx*>(h->allocator.ctx);
  Py_XDECREF(c->owner);
  delete c;
}

py::object make_handler(py::object owner, const char* name) {
  auto* c = new HandlerCtx;
  if (!owner.is_none()) {
    c->alloc = &owner.cast<tl::mem::Caching&>();
    c->owner = owner.ptr();
    Py_INCREF(c->owner);
    c->base = c->alloc->data();
    c->cap = c->alloc->capacity();
  }
  std::snprintf(c->handler.name, sizeof(c->handler.name), "%s", name);
  c->handler.version = 1;
  c->handler.allocator = NpyAllocator{c, h_malloc, h_calloc, h_realloc, h_free};
  PyObject* cap = PyCapsule_New(&c->handler, "mem_handler", capsule_destructor);
  if (cap == nullptr) {
    Py_XDECREF(c->owner);
    delete c;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

HandlerCtx* handler_ctx(const py::object& cap) {
  auto* h = static_cast<NpyHandler*>(PyCapsule_GetPointer(cap.ptr(), "mem_handler"));
  if (h == nullptr) throw py::error_already_set();
  if (h->allocator.malloc != h_malloc) tl::value_error("handler: not a tinylearn numpy handler");
  return static_cast<HandlerCtx*>(h->allocator.ctx);
}

py::object set_numpy_handler(py::object cap) {
  py::object api = py::module_::import("numpy._core._multiarray_umath").attr("_ARRAY_API");
  void** table = static_cast<void**>(PyCapsule_GetPointer(api.ptr(), nullptr));
  if (table == nullptr) throw py::error_already_set();
  auto set = reinterpret_cast<PyObject* (*)(PyObject*)>(table[304]);  // PyDataMem_SetHandler
  if (!cap.is_none() && !PyCapsule_IsValid(cap.ptr(), "mem_handler"))
    tl::value_error("handler: expected a 'mem_handler' capsule or None");
  PyObject* prev = set(cap.is_none() ? nullptr : cap.ptr());
  if (prev == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(prev);
}

}  // namespace

TL_REGISTER(memory) {
  using namespace tl::mem;
  m.doc() = "allocators over a C++-owned arena (offsets), mirroring tinylearn/memory/*.py";
  py::register_exception<OutOfMemory>(m, "OutOfMemory", PyExc_MemoryError);

  py::class_<Bump> bump(m, "Bump");
  bump.def(py::init<i64, i64>(), py::arg("capacity"), py::arg("alignment") = 64).def("reset", &Bump::reset);
  bind_simple<Bump>(bump);

  py::class_<FreeList> fl(m, "FreeList");
  fl.def(py::init<i64, i64, bool>(), py::arg("capacity"), py::arg("alignment") = 64, py::arg("best_fit") = false);
  bind_simple<FreeList>(fl);

  py::class_<Buddy> buddy(m, "Buddy");
  buddy.def(py::init<i64, i64>(), py::arg("capacity"), py::arg("min_block") = 256);
  bind_simple<Buddy>(buddy);

  py::class_<Slab> slab(m, "Slab");
  slab.def(py::init<const std::vector<i64>&, i64, i64, i64>(), py::arg("sizes"), py::arg("capacity") = i64(1) << 24,
           py::arg("slab_size") = i64(1) << 16, py::arg("alignment") = 16)
      .def_property_readonly("classes", &Slab::classes);
  bind_simple<Slab>(slab);

  py::class_<Caching> caching(m, "Caching");
  caching
      .def(py::init([](i64 capacity, i64 round_to, i64 small_size, i64 small_buffer, i64 large_buffer,
                       i64 min_large_alloc, i64 round_large, i64 max_split_size) {
             CachingConfig c{round_to,        small_size,  small_buffer,  large_buffer,
                             min_large_alloc, round_large, max_split_size};
             return new Caching(capacity, c);
           }),
           py::arg("capacity"), py::arg("round_to") = 512, py::arg("small_size") = 1 << 20,
           py::arg("small_buffer") = 2 << 20, py::arg("large_buffer") = 20 << 20, py::arg("min_large_alloc") = 10 << 20,
           py::arg("round_large") = 2 << 20, py::arg("max_split_size") = -1)
      .def("malloc", &Caching::malloc, py::arg("nbytes"), py::arg("stream") = 0,
           py::call_guard<py::gil_scoped_release>(), "allocate nbytes on stream; thread-safe")
      .def("free", &Caching::free, py::arg("offset"), py::call_guard<py::gil_scoped_release>(), "thread-safe")
      .def("empty_cache", &Caching::empty_cache, py::call_guard<py::gil_scoped_release>())
      .def("snapshot",
           [](Caching& c) {
             py::list out;
             for (auto& s : c.snapshot()) {
               py::list blocks;
               i64 alloc = 0;
               for (auto& [o, sz, req, a] : s.blocks) {
                 py::dict b;
                 b["offset"] = o;
                 b["size"] = sz;
                 b["requested"] = req;
                 b["state"] = a ? "active_allocated" : "inactive";
                 if (a) alloc += sz;
                 blocks.append(b);
               }
               py::dict d;
               d["offset"] = s.offset;
               d["total_size"] = s.total_size;
               d["allocated_size"] = alloc;
               d["stream"] = s.stream;
               d["segment_type"] = s.small ? "small" : "large";
               d["blocks"] = blocks;
               out.append(d);
             }
             return out;
           })
      .def(
          "replay",
          [](Caching& c, const Ops& ops) {
            return replay_impl(
                c, ops, true, [](Caching& x, i64 nb) { return x.malloc(nb, 0); },
                [](Caching& x, i64 off) { x.free(off); });
          },
          py::arg("ops"), "run a trace in C++ (stream 0, GIL released): (offsets, seconds)");
  bind_common<Caching>(caching, true);

  m.def(
      "numpy_handler", [](py::object caching) { return make_handler(caching, "tinylearn_caching"); },
      py::arg("caching"), "numpy data-memory handler capsule that allocates from a Caching allocator");
  m.def(
      "counting_numpy_handler", []() { return make_handler(py::none(), "tinylearn_counting_malloc"); },
      "numpy data-memory handler that forwards to malloc/free and counts the calls");
  m.def(
      "recording_numpy_handler",
      []() {
        py::object cap = make_handler(py::none(), "tinylearn_recording_malloc");
        handler_ctx(cap)->record = true;
        return cap;
      },
      "numpy data-memory handler that forwards to malloc/free and records the allocation trace");
  m.def(
      "handler_trace",
      [](py::object cap) {
        HandlerCtx* c = handler_ctx(cap);
        std::lock_guard<std::mutex> g(c->rec_mu);
        py::array_t<i64> out({i64(c->trace.size() / 2), i64(2)});
        std::copy(c->trace.begin(), c->trace.end(), out.mutable_data());
        return out;
      },
      py::arg("handler"), "recorded trace rows (op, arg) so far (frees of still-live blocks not included)");
  m.def("set_numpy_handler", &set_numpy_handler, py::arg("handler"),
        "install a handler capsule (None: numpy's default) for the current context; returns the previous one");
  m.def(
      "handler_stats",
      [](py::object cap) {
        HandlerCtx* c = handler_ctx(cap);
        py::dict d;
        d["n_malloc"] = c->n_malloc.load();
        d["n_free"] = c->n_free.load();
        d["n_fallback"] = c->n_fallback.load();
        d["n_system"] = c->n_system.load();
        return d;
      },
      py::arg("handler"));
  m.def("malloc_replay", &malloc_replay, py::arg("ops"),
        "the trace through glibc malloc/free in a C++ loop; returns seconds (the in-C++ baseline)");
}
