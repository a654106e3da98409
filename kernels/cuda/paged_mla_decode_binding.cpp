// PyTorch entry point of the CUDA kernel in paged_mla_decode.cu; built only where PyTorch has CUDA.
// Same signature as the CPU twin's: paged_mla_attention(q [batch, n_q, heads, dim], kv_pool, page_table,
// seq_lens, page_size, kv_lora_rank, sm_scale, out=None, num_splits=0); it refuses what the twin refuses,
// with the twin's messages (a page id outside the KV pool included: the kernel flags it, see the .cu).

#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>

extern "C" {
size_t longctx_paged_mla_smem_bytes(int dtype, int64_t dim);
int longctx_paged_mla_threads();
int64_t longctx_paged_mla_max_kv_lora_rank();
int64_t longctx_paged_mla_workspace_floats(int64_t batch, int64_t splits, int64_t rows, int64_t lat);
int longctx_paged_mla_attention(int dtype, const void* q, const void* pool, const int64_t* table, const int64_t* lens,
                                void* out, float* ws, int64_t batch, int64_t n_q, int64_t heads, int64_t dim,
                                int64_t lat, int64_t max_pages, int64_t page_size, int64_t slots, int splits,
                                float scale, cudaStream_t stream);
}

namespace {

constexpr int64_t MIN_SPLIT = 256;  // fewest tokens a split (thread block) is given
constexpr int PAGE_OUTSIDE_POOL = -1;  // longctx_paged_mla_attention's code for a page id outside the pool

torch::Tensor paged_mla_attention(torch::Tensor q, torch::Tensor kv_pool, torch::Tensor page_table,
                                  torch::Tensor seq_lens, int64_t page_size, int64_t kv_lora_rank, double sm_scale,
                                  c10::optional<torch::Tensor> out_opt, int64_t num_splits) {
  TORCH_CHECK(q.is_cuda() && kv_pool.is_cuda(), "the CUDA kernel takes CUDA tensors");
  TORCH_CHECK(q.dim() == 4 && kv_pool.dim() == 2, "q must be [batch, n_q, heads, dim] and kv_pool [slots, dim]");
  TORCH_CHECK(q.scalar_type() == kv_pool.scalar_type(), "q and kv_pool must have one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "dtype must be float32 or bfloat16");
  TORCH_CHECK(page_size >= 1, "page_size must be at least 1");
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t batch = q.size(0), n_q = q.size(1), heads = q.size(2), dim = q.size(3);
  TORCH_CHECK(kv_pool.size(1) == dim, "q has ", dim, " dims per head but the KV cells have ", kv_pool.size(1));
  TORCH_CHECK(kv_lora_rank >= 1 && kv_lora_rank <= dim, "kv_lora_rank must be in [1, dim]");
  TORCH_CHECK(dim % 16 == 0 && kv_lora_rank % 16 == 0, "the CUDA kernel copies 16-byte pieces: dim (", dim,
              ") and kv_lora_rank (", kv_lora_rank, ") must be multiples of 16");
  TORCH_CHECK(kv_lora_rank <= longctx_paged_mla_max_kv_lora_rank(), "the CUDA kernel takes kv_lora_rank up to ",
              longctx_paged_mla_max_kv_lora_rank(), ", got ", kv_lora_rank);
  TORCH_CHECK(kv_pool.size(0) % page_size == 0, "the KV pool's slots must be whole pages");
  TORCH_CHECK(page_table.dim() == 2 && page_table.size(0) == batch, "page_table must be [batch, max_pages]");
  TORCH_CHECK(seq_lens.numel() == batch, "seq_lens must hold one length per request");
  // the longest request sizes the splits: read on the host when the lengths are there (no sync)
  const auto lens_cpu = seq_lens.to(at::kCPU, at::kLong).contiguous();
  int64_t max_len = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = lens_cpu.data_ptr<int64_t>()[b];
    TORCH_CHECK(n >= n_q, "request ", b, " has ", n, " cells, fewer than its ", n_q, " query tokens");
    TORCH_CHECK((n + page_size - 1) / page_size <= page_table.size(1), "request ", b, " needs more pages than page_table holds");
    max_len = std::max(max_len, n);
  }
  auto qc = q.contiguous();
  auto pool = kv_pool.contiguous();
  auto table = page_table.to(q.device(), at::kLong).contiguous();
  auto lens = lens_cpu.to(q.device(), /*non_blocking=*/true);
  torch::Tensor out = out_opt.has_value() ? *out_opt : torch::empty({batch, n_q, heads, kv_lora_rank}, q.options());
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == q.scalar_type() && out.is_cuda(), "out must be contiguous, on the GPU, of q's dtype");
  TORCH_CHECK(out.numel() == batch * n_q * heads * kv_lora_rank, "out must be [batch, n_q, heads, kv_lora_rank]");
  int64_t splits = num_splits;
  if (splits <= 0) {  // about two blocks per SM over the whole grid, each at least MIN_SPLIT tokens
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, q.device().index());
    const int64_t row_groups = (n_q * heads + 15) / 16;
    const int64_t want = (2 * sms + batch * row_groups - 1) / (batch * row_groups);
    splits = std::max<int64_t>(1, std::min(want, (max_len + MIN_SPLIT - 1) / MIN_SPLIT));
  }
  const int dtype = q.scalar_type() == at::kBFloat16 ? 1 : 0;
  auto ws = torch::empty({longctx_paged_mla_workspace_floats(batch, splits, n_q * heads, kv_lora_rank)},
                         q.options().dtype(at::kFloat));
  const int err = longctx_paged_mla_attention(dtype, qc.data_ptr(), pool.data_ptr(), table.data_ptr<int64_t>(),
                                              lens.data_ptr<int64_t>(), out.data_ptr(), ws.data_ptr<float>(), batch, n_q,
                                              heads, dim, kv_lora_rank, table.size(1), page_size, pool.size(0),
                                              static_cast<int>(splits), static_cast<float>(sm_scale),
                                              c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err != PAGE_OUTSIDE_POOL, "paged_mla_decode: a page id in page_table points outside the KV pool");
  if (err != 0) {
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, q.device().index());
    TORCH_CHECK(false, "paged MLA CUDA kernel failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)),
                " (shared memory needed: ", longctx_paged_mla_smem_bytes(dtype, dim), " bytes; this GPU gives a block ",
                optin, ")");
  }
  return out;
}

// Dynamic shared memory of the split kernel (bytes) for KV cells of `dim` values of this dtype.
int64_t shared_memory_bytes(const std::string& dtype, int64_t dim) {
  TORCH_CHECK(dtype == "float32" || dtype == "bfloat16", "dtype must be float32 or bfloat16");
  return static_cast<int64_t>(longctx_paged_mla_smem_bytes(dtype == "bfloat16" ? 1 : 0, dim));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CUDA paged MLA decode / verify attention kernel (flash-decoding splits, page table, cp.async tiles)";
  m.def("paged_mla_attention", &paged_mla_attention, "paged MLA attention for n_q query tokens per request",
        py::arg("q"), py::arg("kv_pool"), py::arg("page_table"), py::arg("seq_lens"), py::arg("page_size"),
        py::arg("kv_lora_rank"), py::arg("sm_scale"), py::arg("out") = py::none(), py::arg("num_splits") = 0);
  m.def("shared_memory_bytes", &shared_memory_bytes, "dynamic shared memory of the split kernel per thread block",
        py::arg("dtype"), py::arg("dim"));
  m.attr("threads_per_block") = longctx_paged_mla_threads();
  m.attr("max_kv_lora_rank") = longctx_paged_mla_max_kv_lora_rank();
}
