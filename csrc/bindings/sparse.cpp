// torch.ops.mla_ext sparse top-k decode (V3.2 and DeepSeek-V4) and its index builders: schemas and
// CUDA implementations. The CPU implementations are the reference (mla_ext/reference.py),
// registered from Python (mla_ext/sparse.py, mla_ext/v4.py).
#include <cstdint>
#include <tuple>
#include <vector>

#include "bindings/stable_helpers.h"
#include "sparse/sparse_decode.h"
#include "sparse/v4_decode.h"

namespace mla::bindings {
namespace {

constexpr const char* kDecodeOp = "sparse_decode_mla";
constexpr const char* kSlotsOp = "sparse_indices_to_slots";
constexpr const char* kCompressedOp = "sparse_compressed_indices";
constexpr const char* kTopkSlotsOp = "sparse_topk_to_slots";
constexpr const char* kCompressedSlotsOp = "compressed_slot_mapping";
constexpr const char* kDecodeV4Op = "sparse_decode_mla_v4";

// The kernels hold these in int: a larger value would wrap (2^32 -> 0, a division by zero).
void check_int32_param(int64_t value, const char* name, const char* op) {
  MLA_ARG_CHECK(value >= 1 && value <= INT32_MAX, op, name << " must be in [1, " << INT32_MAX << "], got " << value);
}

// A contiguous `t` (1-D inputs and index lists the kernels read densely): `t` itself when it is,
// else a copy (the slow path of a strided view; the wrappers do not copy).
Tensor contiguous_or_copy(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

// Runs a validated sparse decode: allocates out and lse, splits the work (plan_sparse_decode),
// allocates the partials a split plan needs (o, then lse, in one allocation, merged by the combine;
// through the caching allocator, so a captured graph keeps its own buffer) and launches: `launch`
// runs the kernels on the completed params (by default run_sparse_decode_mla).
template <typename Launch>
std::tuple<Tensor, Tensor> run_sparse(SparseDecodeParams& params, int device, Launch&& launch) {
  const int64_t b = params.batch, s_q = params.s_q, h_q = params.h_q;
  Tensor out = empty_cuda({b, s_q, h_q, kKvLoraRank}, ScalarType::BFloat16, device);
  Tensor lse = empty_cuda({b, h_q, s_q}, ScalarType::Float, device);
  params.out = out.data_ptr();
  params.lse = static_cast<float*>(lse.data_ptr());
  plan_sparse_decode(params, device);
  std::optional<Tensor> partials;
  if (params.num_splits > 1) {
    const int64_t rows = params.num_splits * (b * s_q - params.split_from) * h_q;
    partials = empty_cuda({rows * (kKvLoraRank + 1)}, ScalarType::Float, device);
    params.partial_out = static_cast<float*>(partials->data_ptr());
    params.partial_lse = params.partial_out + rows * kKvLoraRank;
  }
  launch();
  return {out, lse};
}
std::tuple<Tensor, Tensor> run_sparse(SparseDecodeParams& params, int device) {
  return run_sparse(params, device, [&] { run_sparse_decode_mla(params, device); });
}

std::tuple<Tensor, Tensor> sparse_decode_mla(Tensor q_in, Tensor kv_cache, Tensor indices, double softmax_scale,
                                             std::string kv_cache_dtype, std::optional<Tensor> topk_length,
                                             std::optional<Tensor> attn_sink) {
  const CacheFormat format = parse_cache_format(kv_cache_dtype, kDecodeOp);
  MLA_ARG_CHECK(format == CacheFormat::kAuto || format == CacheFormat::kFp8DsMla, kDecodeOp,
                "kv_cache_dtype must be 'auto' (bf16) or 'fp8_ds_mla' for sparse decode, got '" << kv_cache_dtype << "'");
  const int device = check_same_cuda_device(
      kDecodeOp, {{"q", &q_in}, {"kv_cache", &kv_cache}, {"indices", &indices}, {"topk_length", opt(topk_length)},
                  {"attn_sink", opt(attn_sink)}});

  // q [b, s_q, h_q, 576] bf16 (the kernels are bf16-only), 16-byte aligned rows (cp.async).
  MLA_ARG_CHECK(q_in.dim() == 4 && q_in.size(3) == kLatentDim, kDecodeOp,
                "q must be [b, s_q, h_q, 576], got " << shape_str(q_in));
  const ScalarType q_type = q_in.scalar_type();
  MLA_ARG_CHECK(q_type == ScalarType::BFloat16, kDecodeOp,
                "q must be bfloat16, got " << scalar_type_name(q_type)
                                           << (q_type == ScalarType::Half
                                                   ? " (the sparse decode kernels take bfloat16 activations only: "
                                                     "convert with q.to(torch.bfloat16))"
                                                   : ""));
  MLA_ARG_CHECK(q_in.stride(3) == 1, kDecodeOp,
                "q's last dim must be contiguous (stride 1), got strides " << strides_str(q_in));
  const int64_t b = q_in.size(0), s_q = q_in.size(1), h_q = q_in.size(2);
  MLA_ARG_CHECK(s_q >= 1 && s_q <= 16, kDecodeOp, "s_q must be 1..16, got " << s_q);
  MLA_ARG_CHECK(h_q >= 1, kDecodeOp, "h_q must be >= 1, got " << h_q);

  // kv_cache [num_blocks, block_size, row] (the formats were narrowed to auto / fp8_ds_mla above).
  check_kv_cache(kv_cache, format, kv_cache_dtype, ScalarType::BFloat16, "q", std::nullopt, kDecodeOp);
  const int64_t cache_elem = element_size(kv_cache.scalar_type());
  MLA_ARG_CHECK((kv_cache.stride(0) * cache_elem) % 16 == 0 && (kv_cache.stride(1) * cache_elem) % 16 == 0 &&
                    mla::aligned16(kv_cache.data_ptr()),
                kDecodeOp, "kv_cache must be 16-byte aligned with page and row strides that are multiples of 16 bytes, "
                           "got strides " << strides_str(kv_cache));

  // indices [b, s_q, topk] int32, last dim contiguous.
  check_index_dtype(indices, "indices", ScalarType::Int, kDecodeOp);
  MLA_ARG_CHECK(indices.dim() == 3 && indices.size(0) == b && indices.size(1) == s_q && indices.size(2) >= 1, kDecodeOp,
                "indices must be [b, s_q, topk] = [" << b << ", " << s_q << ", topk >= 1], got " << shape_str(indices));
  MLA_ARG_CHECK(indices.size(2) <= kSparseMaxTopk, kDecodeOp,
                "topk (indices.shape[2]) must be <= " << kSparseMaxTopk << ", got " << indices.size(2));
  MLA_ARG_CHECK(indices.stride(2) == 1 || indices.size(2) == 1, kDecodeOp,
                "indices' last dim must be contiguous (stride 1), got strides " << strides_str(indices));
  std::optional<Tensor> topk_length_c, attn_sink_c;
  if (topk_length.has_value()) {
    check_index_dtype(*topk_length, "topk_length", ScalarType::Int, kDecodeOp);
    MLA_ARG_CHECK(topk_length->dim() == 1 && topk_length->size(0) == b, kDecodeOp,
                  "topk_length must be int32 [b] = [" << b << "], got " << shape_str(*topk_length));
    topk_length_c = contiguous_or_copy(*topk_length);
  }
  if (attn_sink.has_value()) {
    MLA_ARG_CHECK(attn_sink->scalar_type() == ScalarType::Float && attn_sink->dim() == 1 && attn_sink->size(0) == h_q,
                  kDecodeOp, "attn_sink must be float32 [h_q] = [" << h_q << "], got "
                                 << scalar_type_name(attn_sink->scalar_type()) << " " << shape_str(*attn_sink));
    attn_sink_c = contiguous_or_copy(*attn_sink);
  }
  const Tensor q = aligned_or_copy(q_in, "q", kDecodeOp);

  const CudaDeviceScope device_scope(device);
  SparseDecodeParams params{};
  params.q = q.data_ptr();
  params.kv_cache = kv_cache.data_ptr();
  params.indices = static_cast<const int32_t*>(indices.data_ptr());
  params.topk_length = topk_length_c.has_value() ? static_cast<const int32_t*>(topk_length_c->data_ptr()) : nullptr;
  params.attn_sink = attn_sink_c.has_value() ? static_cast<const float*>(attn_sink_c->data_ptr()) : nullptr;
  params.batch = static_cast<int>(b);
  params.s_q = static_cast<int>(s_q);
  params.h_q = static_cast<int>(h_q);
  params.topk = static_cast<int>(indices.size(2));
  params.stride_q_b = q.stride(0);
  params.stride_q_s = q.stride(1);
  params.stride_q_h = q.stride(2);
  params.stride_indices_b = indices.stride(0);
  params.stride_indices_s = indices.stride(1);
  params.stride_cache_block_bytes = kv_cache.stride(0) * cache_elem;
  params.stride_cache_token_bytes = kv_cache.stride(1) * cache_elem;
  params.block_size = kv_cache.size(1);
  params.num_slots = kv_cache.size(0) * kv_cache.size(1);
  params.softmax_scale = static_cast<float>(softmax_scale);
  params.format = format;
  params.stream = current_stream(device);
  return run_sparse(params, device);
}

void sparse_indices_to_slots(Tensor local_indices_in, Tensor block_table, int64_t block_size, Tensor slots) {
  const int device = check_same_cuda_device(
      kSlotsOp, {{"local_indices", &local_indices_in}, {"block_table", &block_table}, {"slots", &slots}});
  check_int32_param(block_size, "block_size", kSlotsOp);
  check_index_dtype(local_indices_in, "local_indices", ScalarType::Int, kSlotsOp);
  MLA_ARG_CHECK(local_indices_in.dim() == 3, kSlotsOp,
                "local_indices must be [b, s_q, topk], got " << shape_str(local_indices_in));
  check_index_dtype(block_table, "block_table", ScalarType::Int, kSlotsOp);
  MLA_ARG_CHECK(block_table.dim() == 2 && (block_table.stride(1) == 1 || block_table.size(1) <= 1) &&
                    block_table.size(0) == local_indices_in.size(0),
                kSlotsOp, "block_table must be [b, max_blocks] with b = " << local_indices_in.size(0)
                                                                          << " and a contiguous last dim, got "
                                                                          << shape_str(block_table));
  MLA_ARG_CHECK(slots.scalar_type() == ScalarType::Int && slots.is_contiguous() && slots.dim() == 3 &&
                    slots.size(0) == local_indices_in.size(0) && slots.size(1) == local_indices_in.size(1) &&
                    slots.size(2) == local_indices_in.size(2),
                kSlotsOp, "slots must be a contiguous int32 tensor of local_indices' shape "
                              << shape_str(local_indices_in) << ", got " << scalar_type_name(slots.scalar_type()) << " "
                              << shape_str(slots));
  const Tensor local_indices = contiguous_or_copy(local_indices_in);
  const CudaDeviceScope device_scope(device);
  SparseIndicesToSlotsParams params{};
  params.local_indices = static_cast<const int32_t*>(local_indices.data_ptr());
  params.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  params.slots = static_cast<int32_t*>(slots.data_ptr());
  params.num_rows_per_request = local_indices.size(1) * local_indices.size(2);
  params.total = local_indices.numel();
  params.stride_block_table = block_table.stride(0);
  params.max_blocks = static_cast<int>(block_table.size(1));
  params.block_size = static_cast<int>(block_size);
  params.stream = current_stream(device);
  run_sparse_indices_to_slots(params);
}

// An output of one value per token of the flat-batch index builders: contiguous `dtype` [T] (the
// C++ twin of _check_per_token_out in mla_ext/sparse.py).
void check_per_token_out(const Tensor& t, const char* name, ScalarType dtype, int64_t num_tokens, const char* op) {
  MLA_ARG_CHECK(t.scalar_type() == dtype && t.dim() == 1 && t.size(0) == num_tokens &&
                    (t.stride(0) == 1 || num_tokens <= 1),
                op, name << " must be a contiguous " << scalar_type_name(dtype) << " [T] = [" << num_tokens << "], got "
                         << scalar_type_name(t.scalar_type()) << " " << shape_str(t));
}

// token_to_req [T] int32 and the block table [R, max_blocks] int32 (last dim contiguous) of the
// flat-batch index builders.
void check_token_to_req_and_table(const Tensor& token_to_req, int64_t num_tokens, const Tensor& block_table, const char* op) {
  check_index_dtype(token_to_req, "token_to_req", ScalarType::Int, op);
  MLA_ARG_CHECK(token_to_req.dim() == 1 && token_to_req.size(0) == num_tokens, op,
                "token_to_req must be [T] = [" << num_tokens << "], got " << shape_str(token_to_req));
  check_index_dtype(block_table, "block_table", ScalarType::Int, op);
  MLA_ARG_CHECK(block_table.dim() == 2 && (block_table.stride(1) == 1 || block_table.size(1) <= 1), op,
                "block_table must be [num_requests, max_blocks] with a contiguous last dim, got " << shape_str(block_table));
}

void sparse_compressed_indices(Tensor positions_in, Tensor token_to_req_in, Tensor block_table, int64_t block_size,
                               int64_t compress_ratio, int64_t num_decode_tokens, Tensor indices, Tensor lengths) {
  const int device = check_same_cuda_device(
      kCompressedOp, {{"positions", &positions_in}, {"token_to_req", &token_to_req_in}, {"block_table", &block_table},
                      {"indices", &indices}, {"lengths", &lengths}});
  check_int32_param(block_size, "block_size", kCompressedOp);
  check_int32_param(compress_ratio, "compress_ratio", kCompressedOp);
  check_index_dtype(positions_in, "positions", ScalarType::Long, kCompressedOp);
  MLA_ARG_CHECK(positions_in.dim() == 1, kCompressedOp, "positions must be [T], got " << shape_str(positions_in));
  const int64_t num_tokens = positions_in.size(0);
  check_token_to_req_and_table(token_to_req_in, num_tokens, block_table, kCompressedOp);
  MLA_ARG_CHECK(indices.scalar_type() == ScalarType::Int && indices.dim() == 2 && indices.size(0) == num_tokens &&
                    indices.stride(1) == 1 && indices.size(1) > 0 && indices.size(1) % 128 == 0,
                kCompressedOp, "indices must be int32 [T, width] with width a positive multiple of 128 and a "
                               "contiguous last dim, got "
                                   << scalar_type_name(indices.scalar_type()) << " " << shape_str(indices));
  check_per_token_out(lengths, "lengths", ScalarType::Int, num_tokens, kCompressedOp);
  MLA_ARG_CHECK(num_decode_tokens >= 0 && num_decode_tokens <= num_tokens, kCompressedOp,
                "num_decode_tokens must be in [0, " << num_tokens << "], got " << num_decode_tokens);
  const Tensor positions = contiguous_or_copy(positions_in), token_to_req = contiguous_or_copy(token_to_req_in);
  const CudaDeviceScope device_scope(device);
  SparseCompressedIndicesParams params{};
  params.positions = static_cast<const int64_t*>(positions.data_ptr());
  params.token_to_req = static_cast<const int32_t*>(token_to_req.data_ptr());
  params.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  params.indices = static_cast<int32_t*>(indices.data_ptr());
  params.lengths = static_cast<int32_t*>(lengths.data_ptr());
  params.num_tokens = num_tokens;
  params.num_requests = block_table.size(0);
  params.num_decode_tokens = num_decode_tokens;
  params.stride_block_table = block_table.stride(0);
  params.stride_indices = indices.stride(0);
  params.width = static_cast<int>(indices.size(1));
  params.max_blocks = static_cast<int>(block_table.size(1));
  params.block_size = static_cast<int>(block_size);
  params.compress_ratio = static_cast<int>(compress_ratio);
  params.stream = current_stream(device);
  run_sparse_compressed_indices(params);
}

void sparse_topk_to_slots(Tensor topk_indices_in, Tensor token_to_req_in, Tensor block_table, int64_t block_size,
                          Tensor slots, Tensor lengths) {
  const int device = check_same_cuda_device(
      kTopkSlotsOp, {{"topk_indices", &topk_indices_in}, {"token_to_req", &token_to_req_in},
                     {"block_table", &block_table}, {"slots", &slots}, {"lengths", &lengths}});
  check_int32_param(block_size, "block_size", kTopkSlotsOp);
  check_index_dtype(topk_indices_in, "topk_indices", ScalarType::Int, kTopkSlotsOp);
  MLA_ARG_CHECK(topk_indices_in.dim() == 2 && topk_indices_in.size(1) < (int64_t(1) << 31), kTopkSlotsOp,
                "topk_indices must be [T, topk], got " << shape_str(topk_indices_in));
  const int64_t num_tokens = topk_indices_in.size(0);
  check_token_to_req_and_table(token_to_req_in, num_tokens, block_table, kTopkSlotsOp);
  MLA_ARG_CHECK(slots.scalar_type() == ScalarType::Int && slots.is_contiguous() && slots.dim() == 2 &&
                    slots.size(0) == num_tokens && slots.size(1) == topk_indices_in.size(1),
                kTopkSlotsOp, "slots must be a contiguous int32 tensor of topk_indices' shape "
                                  << shape_str(topk_indices_in) << ", got " << scalar_type_name(slots.scalar_type())
                                  << " " << shape_str(slots));
  check_per_token_out(lengths, "lengths", ScalarType::Int, num_tokens, kTopkSlotsOp);
  const Tensor topk_indices = contiguous_or_copy(topk_indices_in);
  const Tensor token_to_req = contiguous_or_copy(token_to_req_in);
  const CudaDeviceScope device_scope(device);
  SparseTopkToSlotsParams params{};
  params.topk_indices = static_cast<const int32_t*>(topk_indices.data_ptr());
  params.token_to_req = static_cast<const int32_t*>(token_to_req.data_ptr());
  params.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  params.slots = static_cast<int32_t*>(slots.data_ptr());
  params.lengths = static_cast<int32_t*>(lengths.data_ptr());
  params.num_tokens = num_tokens;
  params.num_requests = block_table.size(0);
  params.stride_topk_indices = topk_indices.size(1);
  params.stride_block_table = block_table.stride(0);
  params.topk = static_cast<int>(topk_indices.size(1));
  params.max_blocks = static_cast<int>(block_table.size(1));
  params.block_size = static_cast<int>(block_size);
  params.stream = current_stream(device);
  run_sparse_topk_to_slots(params);
}

void compressed_slot_mapping(Tensor positions_in, Tensor token_to_req_in, Tensor block_table, int64_t block_size,
                             int64_t compress_ratio, Tensor slot_mapping) {
  const int device = check_same_cuda_device(
      kCompressedSlotsOp, {{"positions", &positions_in}, {"token_to_req", &token_to_req_in},
                           {"block_table", &block_table}, {"slot_mapping", &slot_mapping}});
  check_int32_param(block_size, "block_size", kCompressedSlotsOp);
  check_int32_param(compress_ratio, "compress_ratio", kCompressedSlotsOp);
  check_index_dtype(positions_in, "positions", ScalarType::Long, kCompressedSlotsOp);
  MLA_ARG_CHECK(positions_in.dim() == 1, kCompressedSlotsOp, "positions must be [T], got " << shape_str(positions_in));
  const int64_t num_tokens = positions_in.size(0);
  check_token_to_req_and_table(token_to_req_in, num_tokens, block_table, kCompressedSlotsOp);
  check_per_token_out(slot_mapping, "slot_mapping", ScalarType::Long, num_tokens, kCompressedSlotsOp);
  const Tensor positions = contiguous_or_copy(positions_in), token_to_req = contiguous_or_copy(token_to_req_in);
  const CudaDeviceScope device_scope(device);
  CompressedSlotMappingParams params{};
  params.positions = static_cast<const int64_t*>(positions.data_ptr());
  params.token_to_req = static_cast<const int32_t*>(token_to_req.data_ptr());
  params.block_table = static_cast<const int32_t*>(block_table.data_ptr());
  params.slot_mapping = static_cast<int64_t*>(slot_mapping.data_ptr());
  params.num_tokens = num_tokens;
  params.num_requests = block_table.size(0);
  params.stride_block_table = block_table.stride(0);
  params.max_blocks = static_cast<int>(block_table.size(1));
  params.block_size = static_cast<int>(block_size);
  params.compress_ratio = static_cast<int>(compress_ratio);
  params.stream = current_stream(device);
  run_compressed_slot_mapping(params);
}

// One index list of the V4 decode ([b, s_q, topk] int32, last dim contiguous) and its lengths.
void check_v4_index_list(const Tensor& indices, const char* name, int64_t b, int64_t s_q,
                         const std::optional<Tensor>& lengths, const char* lengths_name) {
  check_index_dtype(indices, name, ScalarType::Int, kDecodeV4Op);
  MLA_ARG_CHECK(indices.dim() == 3 && indices.size(0) == b && indices.size(1) == s_q && indices.size(2) >= 1,
                kDecodeV4Op, name << " must be [b, s_q, topk] = [" << b << ", " << s_q << ", topk >= 1], got "
                                  << shape_str(indices));
  MLA_ARG_CHECK(indices.size(2) <= 1 || indices.stride(2) == 1, kDecodeV4Op,
                name << "'s last dim must be contiguous (stride 1), got strides " << strides_str(indices));
  if (lengths.has_value()) {
    check_index_dtype(*lengths, lengths_name, ScalarType::Int, kDecodeV4Op);
    MLA_ARG_CHECK(lengths->dim() == 1 && lengths->size(0) == b, kDecodeV4Op,
                  lengths_name << " must be int32 [b] = [" << b << "], got " << shape_str(*lengths));
  }
}

V4Pool v4_pool(const Tensor& cache, const Tensor& indices, const std::optional<Tensor>& lengths) {
  V4Pool pool{};
  pool.cache = cache.data_ptr();
  pool.indices = static_cast<const int32_t*>(indices.data_ptr());
  pool.lengths = lengths.has_value() ? static_cast<const int32_t*>(lengths->data_ptr()) : nullptr;
  pool.stride_indices_b = indices.stride(0);
  pool.stride_indices_s = indices.stride(1);
  pool.topk = static_cast<int>(indices.size(2));
  pool.block_size = cache.size(1);
  pool.num_slots = cache.size(0) * cache.size(1);
  pool.stride_block_bytes = cache.stride(0) * element_size(cache.scalar_type());
  pool.stride_token_bytes = cache.stride(1) * element_size(cache.scalar_type());
  return pool;
}

// DeepSeek-V4 sparse decode (csrc/sparse/v4_decode.h): on sm90 with fp8_ds_mla pools and more than
// 32 heads the fused kernel; otherwise the selected rows of both pools are gathered, dequantised to
// bf16 and widened to the V3 latent layout, then the V3 sparse decode runs on them with -1 at the
// invalid entries (correct on every architecture; the rows are written and read once more).
std::tuple<Tensor, Tensor> sparse_decode_mla_v4(Tensor q, Tensor kv_cache, Tensor indices, double softmax_scale,
                                                std::string kv_cache_dtype, std::optional<Tensor> topk_length,
                                                std::optional<Tensor> attn_sink, std::optional<Tensor> extra_kv_cache,
                                                std::optional<Tensor> extra_indices,
                                                std::optional<Tensor> extra_topk_length) {
  const char* op = kDecodeV4Op;
  MLA_ARG_CHECK(kv_cache_dtype == "auto" || kv_cache_dtype == "fp8_ds_mla", op,
                "kv_cache_dtype must be one of ('auto', 'fp8_ds_mla') for DeepSeek-V4, got '" << kv_cache_dtype << "'");
  const bool ds_mla = kv_cache_dtype == "fp8_ds_mla";
  const int device = check_same_cuda_device(
      op, {{"q", &q}, {"kv_cache", &kv_cache}, {"indices", &indices}, {"topk_length", opt(topk_length)},
           {"attn_sink", opt(attn_sink)}, {"extra_kv_cache", opt(extra_kv_cache)},
           {"extra_indices", opt(extra_indices)}, {"extra_topk_length", opt(extra_topk_length)}});
  MLA_ARG_CHECK(q.dim() == 4 && q.size(3) == kV4HeadDim, op,
                "q must be [b, s_q, h_q, 512] (DeepSeek-V4: 448 NoPE + 64 RoPE), got "
                    << shape_str(q)
                    << (q.dim() == 4 && q.size(3) == kLatentDim
                            ? " (a 576-wide q is V3's latent query: use sparse_decode_mla)"
                            : ""));
  const ScalarType q_type = q.scalar_type();
  MLA_ARG_CHECK(q_type == ScalarType::BFloat16, op,
                "q must be bfloat16, got " << scalar_type_name(q_type)
                                           << (q_type == ScalarType::Half
                                                   ? " (the sparse decode kernels take bfloat16 activations only: "
                                                     "convert with q.to(torch.bfloat16))"
                                                   : ""));
  MLA_ARG_CHECK(q.stride(3) == 1, op, "q's last dim must be contiguous (stride 1), got strides " << strides_str(q));
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  MLA_ARG_CHECK(s_q >= 1 && s_q <= 16, op, "s_q must be 1..16, got " << s_q);
  MLA_ARG_CHECK(h_q >= 1, op, "h_q must be >= 1, got " << h_q);
  check_kv_cache_v4(kv_cache, "kv_cache", ds_mla, ScalarType::BFloat16, "q", op);
  check_v4_index_list(indices, "indices", b, s_q, topk_length, "topk_length");
  if (attn_sink.has_value()) {
    MLA_ARG_CHECK(attn_sink->scalar_type() == ScalarType::Float && attn_sink->dim() == 1 && attn_sink->size(0) == h_q,
                  op, "attn_sink must be float32 [h_q] = [" << h_q << "], got "
                          << scalar_type_name(attn_sink->scalar_type()) << " " << shape_str(*attn_sink));
  }
  int64_t total = indices.size(2);
  if (!extra_kv_cache.has_value()) {
    MLA_ARG_CHECK(!extra_indices.has_value(), op, "extra_indices given without extra_kv_cache");
    MLA_ARG_CHECK(!extra_topk_length.has_value(), op, "extra_topk_length given without extra_kv_cache");
  } else {
    MLA_ARG_CHECK(extra_indices.has_value(), op, "extra_kv_cache needs extra_indices [b, s_q, extra_topk]");
    check_kv_cache_v4(*extra_kv_cache, "extra_kv_cache", ds_mla, ScalarType::BFloat16, "q", op);
    check_v4_index_list(*extra_indices, "extra_indices", b, s_q, extra_topk_length, "extra_topk_length");
    total += extra_indices->size(2);
  }
  MLA_ARG_CHECK(total <= kSparseMaxTopk, op,
                "topk + extra_topk (the last dims of indices and extra_indices) must be <= " << kSparseMaxTopk
                                                                                             << ", got " << total);
  // This path's own limits: the gathered rows are numbered in int32 and the V3 kernels take at
  // most 65535 query tokens.
  MLA_ARG_CHECK(b * s_q <= 65535 && b * s_q * total <= INT32_MAX, op,
                "b * s_q must be <= 65535 and b * s_q * (topk + extra_topk) <= " << INT32_MAX << ", got b " << b
                                                                                 << ", s_q " << s_q << ", topk + extra_topk "
                                                                                 << total);

  const CudaDeviceScope device_scope(device);
  const cudaStream_t stream = current_stream(device);
  std::optional<Tensor> topk_length_c, extra_topk_length_c, attn_sink_c;
  if (topk_length.has_value()) topk_length_c = contiguous_or_copy(*topk_length);
  if (extra_topk_length.has_value()) extra_topk_length_c = contiguous_or_copy(*extra_topk_length);
  if (attn_sink.has_value()) attn_sink_c = contiguous_or_copy(*attn_sink);
  const float* attn_sink_ptr = attn_sink_c.has_value() ? static_cast<const float*>(attn_sink_c->data_ptr()) : nullptr;

  // Fused (sm90, fp8_ds_mla, more than 32 heads; csrc/sparse/sm90/sparse_decode_sm90_v4.cu): the
  // rows are read once from both caches (16-byte aligned bases for the bulk copies).
  const int64_t tiles = (indices.size(2) + 63) / 64 + (extra_indices.has_value() ? (extra_indices->size(2) + 63) / 64 : 0);
  if (ds_mla && v4_fused_supported(device, h_q) && mla::aligned16(kv_cache.data_ptr()) &&
      (!extra_kv_cache.has_value() || mla::aligned16(extra_kv_cache->data_ptr())) && 64 * tiles <= kSparseMaxTopk) {
    const Tensor q_rows = aligned_or_copy(q, "q", op);
    V4FusedParams fused{};
    fused.pool[0] = v4_pool(kv_cache, indices, topk_length_c);
    if (extra_kv_cache.has_value()) fused.pool[1] = v4_pool(*extra_kv_cache, *extra_indices, extra_topk_length_c);
    SparseDecodeParams& params = fused.sparse;
    params.q = q_rows.data_ptr();
    params.attn_sink = attn_sink_ptr;
    params.batch = static_cast<int>(b);
    params.s_q = static_cast<int>(s_q);
    params.h_q = static_cast<int>(h_q);
    params.topk = static_cast<int>(64 * tiles);  // what the plan splits: both lists in 64-key tiles
    params.stride_q_b = q_rows.stride(0);
    params.stride_q_s = q_rows.stride(1);
    params.stride_q_h = q_rows.stride(2);
    params.block_size = 1;  // (the pools carry their own)
    params.softmax_scale = static_cast<float>(softmax_scale);
    params.format = CacheFormat::kFp8DsMla;
    params.stream = stream;
    return run_sparse(params, device, [&] { run_sparse_decode_v4_fused(fused, device); });
  }

  Tensor q_wide = empty_cuda({b, s_q, h_q, kLatentDim}, ScalarType::BFloat16, device);
  Tensor rows = empty_cuda({b * s_q * total, kLatentDim}, ScalarType::BFloat16, device);
  Tensor row_index = empty_cuda({b, s_q, total}, ScalarType::Int, device);

  V4GatherParams g{};
  g.q = q.data_ptr();
  g.stride_q_b = q.stride(0);
  g.stride_q_s = q.stride(1);
  g.stride_q_h = q.stride(2);
  g.pool[0] = v4_pool(kv_cache, indices, topk_length_c);
  if (extra_kv_cache.has_value()) g.pool[1] = v4_pool(*extra_kv_cache, *extra_indices, extra_topk_length_c);
  g.ds_mla = ds_mla;
  g.b = static_cast<int>(b);
  g.s_q = static_cast<int>(s_q);
  g.h_q = static_cast<int>(h_q);
  g.q_wide = q_wide.data_ptr();
  g.rows = rows.data_ptr();
  g.row_index = static_cast<int32_t*>(row_index.data_ptr());
  g.stream = stream;
  run_v4_gather(g);

  SparseDecodeParams params{};
  params.q = q_wide.data_ptr();
  params.kv_cache = rows.data_ptr();
  params.indices = g.row_index;
  params.topk_length = nullptr;  // (the lengths made the entries past them -1)
  params.attn_sink = attn_sink_ptr;
  params.batch = static_cast<int>(b);
  params.s_q = static_cast<int>(s_q);
  params.h_q = static_cast<int>(h_q);
  params.topk = static_cast<int>(total);
  params.stride_q_b = s_q * h_q * kLatentDim;
  params.stride_q_s = h_q * kLatentDim;
  params.stride_q_h = kLatentDim;
  params.stride_indices_b = s_q * total;
  params.stride_indices_s = total;
  params.stride_cache_block_bytes = 2 * kLatentDim;  // one row per block
  params.stride_cache_token_bytes = 2 * kLatentDim;
  params.block_size = 1;
  params.num_slots = b * s_q * total;
  params.softmax_scale = static_cast<float>(softmax_scale);
  params.format = CacheFormat::kAuto;
  params.stream = stream;
  return run_sparse(params, device);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(mla_ext, m) {
  m.def(
      "sparse_decode_mla(Tensor q, Tensor kv_cache, Tensor indices, float softmax_scale, str kv_cache_dtype, "
      "Tensor? topk_length=None, Tensor? attn_sink=None) -> (Tensor, Tensor)");
  m.def(
      "sparse_decode_mla_v4(Tensor q, Tensor kv_cache, Tensor indices, float softmax_scale, str kv_cache_dtype, "
      "Tensor? topk_length=None, Tensor? attn_sink=None, Tensor? extra_kv_cache=None, Tensor? extra_indices=None, "
      "Tensor? extra_topk_length=None) -> (Tensor, Tensor)");
  m.def("sparse_indices_to_slots(Tensor local_indices, Tensor block_table, int block_size, Tensor(a!) slots) -> ()");
  m.def(
      "sparse_compressed_indices(Tensor positions, Tensor token_to_req, Tensor block_table, int block_size, "
      "int compress_ratio, int num_decode_tokens, Tensor(a!) indices, Tensor(b!) lengths) -> ()");
  m.def(
      "sparse_topk_to_slots(Tensor topk_indices, Tensor token_to_req, Tensor block_table, int block_size, "
      "Tensor(a!) slots, Tensor(b!) lengths) -> ()");
  m.def(
      "compressed_slot_mapping(Tensor positions, Tensor token_to_req, Tensor block_table, int block_size, "
      "int compress_ratio, Tensor(a!) slot_mapping) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mla_ext, CUDA, m) {
  m.impl("sparse_decode_mla", TORCH_BOX(&sparse_decode_mla));
  m.impl("sparse_decode_mla_v4", TORCH_BOX(&sparse_decode_mla_v4));
  m.impl("sparse_indices_to_slots", TORCH_BOX(&sparse_indices_to_slots));
  m.impl("sparse_compressed_indices", TORCH_BOX(&sparse_compressed_indices));
  m.impl("sparse_topk_to_slots", TORCH_BOX(&sparse_topk_to_slots));
  m.impl("compressed_slot_mapping", TORCH_BOX(&compressed_slot_mapping));
}

}  // namespace mla::bindings
