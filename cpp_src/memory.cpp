// memory.cpp — tinylearn._C.memory: Python bindings of the allocators in memory/*.h.
//
// Classes (each mirrors tinylearn/memory/<name>.py; same offsets for the same trace):
//   Bump(capacity, alignment)                FreeList(capacity, alignment, best_fit)
//   Buddy(capacity, min_block)               Slab(sizes, capacity, slab_size, alignment)
//   Caching(capacity, round_to, small_size, small_buffer, large_buffer, min_large_alloc, round_large,
//           max_split_size, fast_path, thread_cache, thread_cache_bytes)
//           -- thread-safe; malloc/free/replay release the GIL;
//           fast_counters() -> dict (memo hits, tree lookups/updates, cancelled/materialized lazy splits);
//           thread_cache_stats() -> dict, flush_thread_cache(): the per-thread cache (thread_cache > 0);
//           fast_calls(fallback_malloc, fallback_free) -> (malloc, free): raw METH_FASTCALL builtins for the
//           Python hot path (no pybind11 dispatch; the GIL is kept unless the allocator's mutex is contended;
//           anything but plain int arguments goes to the fallbacks, which give the exact Python-side errors)
// Common methods: malloc(nbytes) -> offset, free(offset), stats() -> dict, block_size(offset),
//   live_blocks(), free_blocks(), arena() -> uint8 numpy view of the C++-owned block (keeps the object alive),
//   replay(ops int64[m, 2]) -> (offsets int64[n_malloc], seconds): the whole trace in a C++ loop, timed in C++.
// Plus malloc_replay(ops) -> seconds: the same loop over glibc malloc/free (the in-C++ baseline).
// The numpy data-memory handlers (NEP 49) of the same submodule are in memory_numpy_handler.cpp.
// Errors: ValueError (std::invalid_argument) / MemoryError (tl::mem::OutOfMemory, registered below).
#include <Python.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

py::dict stats_dict(const tl::mem::Stats& s, bool caching, i64 thread_cached = -1) {
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
    if (thread_cached >= 0) d["thread_cached"] = thread_cached;  // only with a per-thread cache
  }
  return d;
}

// {name: value} of integer counters (thread_cache_stats(), fast_counters())
py::dict counters_dict(std::initializer_list<std::pair<const char*, i64>> items) {
  py::dict d;
  for (auto& [k, v] : items) d[k] = v;
  return d;
}

using Ops = py::array_t<i64, py::array::c_style | py::array::forcecast>;

const i64* ops_ptr(const Ops& ops, i64& m) {
  if (ops.ndim() != 2 || ops.shape(1) != 2)
    tl::value_error("ops: expected an int64 array of shape [m, 2], got ndim " + std::to_string(ops.ndim()));
  m = ops.shape(0);
  return ops.data();
}

// Run a trace through `a` in C++; the timer brackets only the loop. With `mu`, the loop runs under that mutex.
template <class A, class MallocFn, class FreeFn>
py::tuple replay_impl(A& a, const Ops& ops, bool release_gil, MallocFn mf, FreeFn ff, std::mutex* mu = nullptr) {
  i64 m = 0;
  const i64* p = ops_ptr(ops, m);
  i64 n = tl::mem::count_mallocs(p, m);
  py::array_t<i64> out(n);
  i64* o = out.mutable_data();
  double secs;
  {
    std::unique_ptr<py::gil_scoped_release> rel;
    if (release_gil) rel = std::make_unique<py::gil_scoped_release>();
    std::unique_lock<std::mutex> lock;  // taken with the GIL released, dropped before it is taken back
    if (mu) lock = std::unique_lock<std::mutex>(*mu);
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
          "stats",
          [caching](A& a) {
            if constexpr (std::is_same_v<A, tl::mem::Caching>) {
              i64 tc = 0;
              tl::mem::Stats s = a.stats(&tc);
              return stats_dict(s, caching, a.thread_cache() > 0 ? tc : -1);
            } else {
              return stats_dict(a.stats(), caching);
            }
          },
          "counters and metrics (dict)")
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

// ---- the Python hot path of the caching allocator: builtins bound to a capsule (no pybind11 dispatch) ----
PyObject* g_oom = nullptr;  // tinylearn._C.memory.OutOfMemory (a MemoryError subclass)
constexpr const char* kFastName = "tinylearn.memory.caching.fast_calls";

struct FastCtx {
  tl::mem::Caching* c;
  PyObject *owner, *fb_malloc, *fb_free;  // strong references
};

void fast_ctx_destroy(PyObject* cap) {
  auto* ctx = static_cast<FastCtx*>(PyCapsule_GetPointer(cap, kFastName));
  if (!ctx) return;
  Py_XDECREF(ctx->owner);
  Py_XDECREF(ctx->fb_malloc);
  Py_XDECREF(ctx->fb_free);
  delete ctx;
}

// Run f() under the allocator's mutex: try_lock with the GIL held (the common, uncontended case costs one atomic);
// when contended, release the GIL for the whole wait + call and unlock before taking the GIL back, so the mutex is
// never held by a thread waiting for the GIL (the numpy handler calls malloc with the GIL held).
// Returns false with a Python exception set if f threw.
template <class F>
bool run_locked(tl::mem::Caching& c, F&& f) {
  std::mutex& mu = c.mutex();
  int err = 0;  // 1 ValueError, 2 OutOfMemory, 3 other
  std::string msg;
  auto call = [&] {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      err = 1, msg = e.what();
    } catch (const tl::mem::OutOfMemory& e) {
      err = 2, msg = e.what();
    } catch (const std::exception& e) {
      err = 3, msg = e.what();
    }
  };
  if (mu.try_lock()) {
    call();
    mu.unlock();
  } else {
    Py_BEGIN_ALLOW_THREADS;
    mu.lock();
    call();
    mu.unlock();
    Py_END_ALLOW_THREADS;
  }
  if (err == 0) return true;
  PyErr_SetString(err == 1 ? PyExc_ValueError : err == 2 ? (g_oom ? g_oom : PyExc_MemoryError) : PyExc_RuntimeError,
                  msg.c_str());
  return false;
}

bool plain_i64(PyObject* o, i64& v) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  v = PyLong_AsLongLongAndOverflow(o, &overflow);
  return overflow == 0 && !(v == -1 && PyErr_Occurred());
}

PyObject* fast_malloc(PyObject* self, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  auto* ctx = static_cast<FastCtx*>(PyCapsule_GetPointer(self, kFastName));
  if (!ctx) return nullptr;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  i64 n = 0, stream = 0;
  if (kwnames != nullptr || nargs < 1 || nargs > 2 || !plain_i64(args[0], n) ||
      (nargs == 2 && !plain_i64(args[1], stream))) {
    PyErr_Clear();
    return PyObject_Vectorcall(ctx->fb_malloc, args, nargs, kwnames);  // exact checks and messages
  }
  i64 off = 0;
  tl::mem::Caching* c = ctx->c;
  if (c->tc_on()) {  // per-thread cache: a hit takes no lock; the first call of a thread registers its cache
    if (c->tc_pop(n, stream, off)) return PyLong_FromLongLong(off);
    if (c->tc_cacheable(n, stream) && !c->tc_registered()) {
      Py_BEGIN_ALLOW_THREADS;  // tc_register takes the allocator's mutex: never wait for it holding the GIL
      c->tc_register();
      Py_END_ALLOW_THREADS;
    }
  }
  if (!run_locked(*c, [&] { off = c->malloc_locked(n, stream); })) return nullptr;
  return PyLong_FromLongLong(off);
}

PyObject* fast_free(PyObject* self, PyObject* arg) {
  auto* ctx = static_cast<FastCtx*>(PyCapsule_GetPointer(self, kFastName));
  if (!ctx) return nullptr;
  i64 off = 0;
  if (!plain_i64(arg, off)) {
    PyErr_Clear();
    return PyObject_CallOneArg(ctx->fb_free, arg);
  }
  tl::mem::Caching* c = ctx->c;
  if (c->tc_on()) {
    if (c->tc_push(off)) Py_RETURN_NONE;
    if (c->tc_user_block(off) && !c->tc_registered()) {
      Py_BEGIN_ALLOW_THREADS;
      c->tc_register();
      Py_END_ALLOW_THREADS;
    }
  }
  if (!run_locked(*c, [&] { c->free_locked(off); })) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef g_fast_malloc_def = {"malloc", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_malloc)),
                                 METH_FASTCALL | METH_KEYWORDS,
                                 "malloc(nbytes, stream=0) -> offset (C++ caching allocator, raw fast call)"};
PyMethodDef g_fast_free_def = {"free", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_free)), METH_O,
                               "free(offset) (C++ caching allocator, raw fast call)"};

py::tuple fast_calls(py::object self, py::object fb_malloc, py::object fb_free) {
  auto* ctx = new FastCtx{&self.cast<tl::mem::Caching&>(), self.ptr(), fb_malloc.ptr(), fb_free.ptr()};
  Py_INCREF(ctx->owner);
  Py_INCREF(ctx->fb_malloc);
  Py_INCREF(ctx->fb_free);
  PyObject* cap = PyCapsule_New(ctx, kFastName, fast_ctx_destroy);
  if (!cap) {
    Py_DECREF(ctx->owner);
    Py_DECREF(ctx->fb_malloc);
    Py_DECREF(ctx->fb_free);
    delete ctx;
    throw py::error_already_set();
  }
  py::object capsule = py::reinterpret_steal<py::object>(cap);
  PyObject* m = PyCFunction_New(&g_fast_malloc_def, capsule.ptr());
  if (!m) throw py::error_already_set();
  py::object mo = py::reinterpret_steal<py::object>(m);
  PyObject* f = PyCFunction_New(&g_fast_free_def, capsule.ptr());
  if (!f) throw py::error_already_set();
  py::object fo = py::reinterpret_steal<py::object>(f);
  return py::make_tuple(mo, fo);
}

}  // namespace

TL_REGISTER(memory) {
  using namespace tl::mem;
  m.doc() = "allocators over a C++-owned arena (offsets), mirroring tinylearn/memory/*.py";
  {
    auto& exc = py::register_exception<OutOfMemory>(m, "OutOfMemory", PyExc_MemoryError);
    g_oom = exc.ptr();  // kept alive by the module attribute
  }

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
                       i64 min_large_alloc, i64 round_large, i64 max_split_size, bool fast_path, i64 thread_cache,
                       i64 thread_cache_bytes) {
             CachingConfig c{round_to,        small_size,  small_buffer,   large_buffer, min_large_alloc,
                             round_large,     max_split_size, fast_path, thread_cache, thread_cache_bytes};
             return new Caching(capacity, c);
           }),
           py::arg("capacity"), py::arg("round_to") = 512, py::arg("small_size") = 1 << 20,
           py::arg("small_buffer") = 2 << 20, py::arg("large_buffer") = 20 << 20, py::arg("min_large_alloc") = 10 << 20,
           py::arg("round_large") = 2 << 20, py::arg("max_split_size") = -1, py::arg("fast_path") = true,
           py::arg("thread_cache") = 0, py::arg("thread_cache_bytes") = 1 << 20)
      .def_property_readonly("fast_path", &Caching::fast_path)
      .def_property_readonly("thread_cache", &Caching::thread_cache, "blocks per size class cached per thread (0: off)")
      .def_property_readonly("thread_cache_max_size", &Caching::thread_cache_max_size,
                             "largest rounded size served by the per-thread cache (0: off)")
      .def(
          "thread_cache_stats",
          [](Caching& c) {
            Caching::TcStats t = c.thread_cache_stats();
            return counters_dict({{"thread_cached", t.thread_cached},
                                  {"thread_cached_blocks", t.thread_cached_blocks},
                                  {"hits_alloc", t.hits_alloc},
                                  {"hits_free", t.hits_free},
                                  {"refills", t.refills},
                                  {"flushes", t.flushes},
                                  {"threads", t.threads},
                                  {"locked_calls", t.locked_calls}});
          },
          "per-thread cache: bytes/blocks held in thread caches, mallocs/frees served by a cache, blocks refilled "
          "from / flushed to the pool, threads with a cache, cacheable calls that took the lock (refill / flush)")
      .def("flush_thread_cache", &Caching::flush_thread_cache, py::call_guard<py::gil_scoped_release>(),
           "return the calling thread's cached blocks to the pool (thread exit does the same)")
      .def(
          "fast_counters",
          [](Caching& c) {
            FastCounters f = c.fast_counters();
            return counters_dict({{"memo_hits", f.memo_hits},
                                  {"tree_lookups", f.tree_lookups},
                                  {"tree_updates", f.tree_updates},
                                  {"cancels", f.cancels},
                                  {"materialized", f.materialized}});
          },
          "fast-path counters: memo hits, std::set lookups and inserts/erases, cancelled / materialized lazy splits")
      .def("fast_calls", &fast_calls, py::arg("fallback_malloc"), py::arg("fallback_free"),
           "(malloc, free) raw fast-call builtins for this allocator (plain ints; other arguments -> the fallbacks)")
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
                 b["state"] = a == 1 ? "active_allocated" : a == 2 ? "thread_cached" : "inactive";
                 if (a == 1) alloc += sz;
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
          [](Caching& c, const Ops& ops, bool lock_per_call) {
            if (lock_per_call)
              return replay_impl(
                  c, ops, true, [](Caching& x, i64 nb) { return x.malloc(nb, 0); },
                  [](Caching& x, i64 off) { x.free(off); });
            // one lock around the whole trace: the allocator's own cost without the two atomics per call
            return replay_impl(
                c, ops, true, [](Caching& x, i64 nb) { return x.malloc_locked(nb, 0); },
                [](Caching& x, i64 off) { x.free_locked(off); }, &c.mutex());
          },
          py::arg("ops"), py::arg("lock_per_call") = true,
          "run a trace in C++ (stream 0, GIL released): (offsets, seconds); lock_per_call=False takes the "
          "allocator's mutex once for the whole trace");
  bind_common<Caching>(caching, true);

  m.def("malloc_replay", &malloc_replay, py::arg("ops"),
        "the trace through glibc malloc/free in a C++ loop; returns seconds (the in-C++ baseline)");
}
