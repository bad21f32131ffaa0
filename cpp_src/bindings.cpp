// bindings.cpp — the tinylearn._C module: one submodule per topic file (see registry.h), plus build info.
#include "common.h"
#include "cpu_features.h"
#include "registry.h"

#include <iterator>

PYBIND11_MODULE(_C, m) {
  m.doc() = "tinylearn compiled kernels: one submodule per cpp_src/<topic>.cpp";
#ifdef TINYLEARN_OPENMP
  m.attr("openmp") = true;
#else
  m.attr("openmp") = false;
#endif
  m.def("omp_max_threads", &tl::n_threads, "OpenMP's default thread count (tl::n_threads; 1 without OpenMP)");
#ifdef __AVX2__
  m.attr("compiled_avx2") = true;
#else
  m.attr("compiled_avx2") = false;
#endif
  m.def("cpu_supports", [](const std::string& feature) { return tl::cpu_has(feature.c_str()); },
        pybind11::arg("feature"),
        "Effective run-time CPU feature check after TINYLEARN_CPU_FEATURES (what dispatching kernels use): "
        "sse4.2, avx, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avxvnni.");
  m.def("cpu_detected", [](const std::string& feature) { return tl::cpu_detected(feature); },
        pybind11::arg("feature"), "What the CPU reports for a feature, ignoring TINYLEARN_CPU_FEATURES.");
  m.def("cpu_features_forced", []() { return tl::cpu_features_forced(); },
        "The level forced by TINYLEARN_CPU_FEATURES ('scalar', 'avx2', 'avx512'), '' when not forced; "
        "ValueError for an invalid value.");
  m.attr("cpu_feature_names") = std::vector<std::string>(std::begin(tl::kCpuFeatureNames),
                                                         std::end(tl::kCpuFeatureNames));
  // The ISA the whole module was compiled for (-march=native on this machine, or portable): with "avx512" the
  // AVX2 kernels, compiled under target attributes on top of it, may use 32 vector registers and AVX-512 encodings,
  // so a forced-AVX2 run is not what an AVX2-only CPU runs; a portable build (TINYLEARN_NATIVE=OFF) is.
#if defined(__AVX512F__)
  m.attr("build_isa") = "avx512";
#elif defined(__AVX2__)
  m.attr("build_isa") = "avx2";
#else
  m.attr("build_isa") = "baseline";
#endif
  std::vector<std::string> names;
  for (auto& [name, fn] : tl::registrars()) {
    auto sub = m.def_submodule(name.c_str());
    fn(sub);
    names.push_back(name);
  }
  m.attr("submodules") = names;
}
