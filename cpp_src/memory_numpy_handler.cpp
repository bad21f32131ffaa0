// memory_numpy_handler.cpp — tinylearn._C.memory (second file of the submodule, see registry.h): numpy
// data-memory handlers (NEP 49, numpy >= 1.22).
//   numpy_handler(caching) -> capsule routes numpy's array data allocations to a Caching allocator (falling back
//   to malloc when it is out of memory); counting_numpy_handler() forwards to malloc/free and only counts (the
//   unpooled baseline); set_numpy_handler(capsule|None) -> previous; handler_stats(capsule) -> dict(n_malloc,
//   n_free, n_fallback, n_system); recording_numpy_handler() + handler_trace(capsule) -> int64 [m, 2] record the
//   allocation trace of everything numpy allocates. The handler structs below mirror numpy's PyDataMem_Handler
//   (version 1); PyDataMem_SetHandler is slot 304 of numpy's C-API table.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "memory/caching.h"
#include "registry.h"

namespace py = pybind11;
using tl::mem::i64;

namespace {

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
}
