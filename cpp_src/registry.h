// registry.h — how a topic's C++ file adds itself to tinylearn._C without editing bindings.cpp.
//
// Each cpp_src/<topic>.cpp ends with
//     TL_REGISTER(topic) { /* m is the submodule tinylearn._C.<topic> */ m.def(...); }
// A static object in that file appends the function to a list at load time; bindings.cpp's PYBIND11_MODULE
// creates one submodule per entry and calls it. Several files may register the same name (one file per op, e.g.
// kernels_softmax.cpp and kernels_layernorm.cpp both say TL_REGISTER(kernels)): their functions are chained
// into the one entry, so _C.kernels is one submodule with every function. Invariant: entry names are unique
// and each function name is defined by one file (float/double overloads of it in that same file); order does
// not matter.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tl {
namespace py = pybind11;
using RegisterFn = void (*)(py::module_&);
using Registrar = std::pair<std::string, std::function<void(py::module_&)>>;

// One entry per submodule name (what bindings.cpp iterates over).
inline std::vector<Registrar>& registrars() {
  static std::vector<Registrar> r;
  return r;
}

// Every (submodule, registration function) pair, one per file that registers into that submodule.
inline std::vector<std::pair<std::string, RegisterFn>>& register_fns() {
  static std::vector<std::pair<std::string, RegisterFn>> r;
  return r;
}

struct Register {
  Register(const char* name, RegisterFn fn) {
    register_fns().emplace_back(name, fn);
    for (auto& r : registrars())
      if (r.first == name) return;  // a later file of the same submodule: the entry already runs every fn of it
    std::string n = name;
    registrars().emplace_back(n, [n](py::module_& m) {
      for (auto& [k, f] : register_fns())
        if (k == n) f(m);
    });
  }
};

// Validation helper: raise ValueError (pybind11 maps std::invalid_argument to ValueError).
[[noreturn]] inline void value_error(const std::string& msg) { throw std::invalid_argument(msg); }
}  // namespace tl

// The function and registrar names carry __COUNTER__ so that several files registering the same submodule can share
// one translation unit (the unity build, CMakeLists.txt: TINYLEARN_UNITY).
#define TL_REGISTER(NAME) TL_REGISTER_IMPL(NAME, __COUNTER__)
#define TL_REGISTER_IMPL(NAME, N) TL_REGISTER_IMPL2(NAME, N)
#define TL_REGISTER_IMPL2(NAME, N)                                                   \
  static void tl_register_##NAME##_##N(pybind11::module_& m);                        \
  static tl::Register tl_registrar_##NAME##_##N(#NAME, &tl_register_##NAME##_##N); \
  static void tl_register_##NAME##_##N(pybind11::module_& m)
