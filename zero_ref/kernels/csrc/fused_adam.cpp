// Python binding of the fused multi-tensor Adam(W) (fused_adam.cu), built by zero_ref.kernels.cuda_ext.
#include <torch/extension.h>

#include <vector>

void fused_adam_cuda(const std::vector<std::vector<at::Tensor>>& lists, double decay, double l2, double w1,
                     double b2, double w2, double inv_bc2_sqrt, double eps, double neg_step_size);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fused_adam", &fused_adam_cuda,
        "One Adam(W) step in place on lists [params, grads, exp_avgs, exp_avg_sqs, params16 (may be empty)]; "
        "the constants are zero_ref.kernels.AdamConstants",
        pybind11::arg("lists"), pybind11::arg("decay"), pybind11::arg("l2"), pybind11::arg("w1"),
        pybind11::arg("b2"), pybind11::arg("w2"), pybind11::arg("inv_bc2_sqrt"), pybind11::arg("eps"),
        pybind11::arg("neg_step_size"));
}
