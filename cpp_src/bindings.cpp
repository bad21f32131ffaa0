// bindings.cpp — the tinylearn._C module: one submodule per topic file (see registry.h), plus build info.
#include "registry.h"

#ifdef TINYLEARN_OPENMP
#include <omp.h>
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "tinylearn compiled kernels: one submodule per cpp_src/<topic>.cpp";
#ifdef TINYLEARN_OPENMP
  m.attr("openmp") = true;
  m.def("omp_max_threads", []() { return omp_get_max_threads(); });
#else
  m.attr("openmp") = false;
  m.def("omp_max_threads", []() { return 1; });
#endif
#ifdef __AVX2__
  m.attr("compiled_avx2") = true;
#else
  m.attr("compiled_avx2") = false;
#endif
  m.def("cpu_supports", [](const std::string& feature) {
    __builtin_cpu_init();
    if (feature == "avx2") return bool(__builtin_cpu_supports("avx2"));
    if (feature == "fma") return bool(__builtin_cpu_supports("fma"));
    if (feature == "avx512f") return bool(__builtin_cpu_supports("avx512f"));
    if (feature == "avx512bw") return bool(__builtin_cpu_supports("avx512bw"));
    if (feature == "avx512vnni") return bool(__builtin_cpu_supports("avx512vnni"));
    if (feature == "avxvnni") return bool(__builtin_cpu_supports("avxvnni"));
    throw std::invalid_argument("cpu_supports: unknown feature '" + feature + "'");
  }, pybind11::arg("feature"), "Run-time CPU feature check (avx2, fma, avx512f, avx512bw, avx512vnni, avxvnni).");
  std::vector<std::string> names;
  for (auto& [name, fn] : tl::registrars()) {
    auto sub = m.def_submodule(name.c_str());
    fn(sub);
    names.push_back(name);
  }
  m.attr("submodules") = names;
}
