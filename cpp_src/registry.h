// registry.h — how a topic's C++ file adds itself to tinylearn._C without editing bindings.cpp.
//
// Each cpp_src/<topic>.cpp ends with
//     TL_REGISTER(topic) { /* m is the submodule tinylearn._C.<topic> */ m.def(...); }
// A static object in that file appends the function to a list at load time; bindings.cpp's PYBIND11_MODULE
// creates one submodule per entry and calls it. Invariant: names are unique; order does not matter.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tl {
namespace py = pybind11;
using Registrar = std::pair<std::string, std::function<void(py::module_&)>>;

inline std::vector<Registrar>& registrars() {
  static std::vector<Registrar> r;
  return r;
}

struct Register {
  Register(const char* name, void (*fn)(py::module_&)) { registrars().emplace_back(name, fn); }
};

// Validation helper: raise ValueError (pybind11 maps std::invalid_argument to ValueError).
[[noreturn]] inline void value_error(const std::string& msg) { throw std::invalid_argument(msg); }
}  // namespace tl

#define TL_REGISTER(NAME)                                               \
  static void tl_register_##NAME(pybind11::module_& m);                 \
  static tl::Register tl_registrar_##NAME(#NAME, &tl_register_##NAME); \
  static void tl_register_##NAME(pybind11::module_& m)
