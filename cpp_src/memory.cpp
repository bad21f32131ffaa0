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
// The numpy data-memory handlers (NEP 49) of the same submodule are in memory_numpy_handler.cpp.
// Errors: ValueError (std::invalid_argument) / MemoryError (tl::mem::OutOfMemory, registered below).
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

  m.def("malloc_replay", &malloc_replay, py::arg("ops"),
        "the trace through glibc malloc/free in a C++ loop; returns seconds (the in-C++ baseline)");
}
