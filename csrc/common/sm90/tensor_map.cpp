// Tensor-map encoding for the sm90 kernels' TMA copies, cached by its arguments.
#include "common/sm90/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <array>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "common/driver_entry.h"

namespace mla::sm90 {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto fn = driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

constexpr int kMaxRank = 5;
// Every argument of make_tensor_map, as words: dtype, swizzle, rank, base, dims, strides, box.
using Key = std::array<uint64_t, 4 + 3 * kMaxRank>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t w : k) h = (h ^ w) * 0x100000001b3ull;
    return static_cast<size_t>(h);
  }
};
// Entries: the maps themselves, or a refusal (the driver's answer is cached too).
struct Entry {
  bool ok;
  CUtensorMap map;
};
// Bounded: a serving engine has one cache tensor per layer and a few weights, far below this
// (activations are not cached).
constexpr size_t kMaxEntries = 4096;

}  // namespace

bool make_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, CUtensorMapSwizzle swizzle, const void* base, int rank,
                     const uint64_t* dims, const uint64_t* byte_strides, const uint32_t* box, bool cached) {
  if (rank < 1 || rank > kMaxRank) return false;
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint32_t elem_strides[kMaxRank] = {1, 1, 1, 1, 1};
  auto encode_into = [&](CUtensorMap* m) {
    return encode(m, dtype, static_cast<cuuint32_t>(rank), const_cast<void*>(base), reinterpret_cast<const cuuint64_t*>(dims),
                  reinterpret_cast<const cuuint64_t*>(byte_strides), reinterpret_cast<const cuuint32_t*>(box), elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  if (!cached) return encode_into(map);
  Key key{};
  key[0] = static_cast<uint64_t>(dtype);
  key[1] = static_cast<uint64_t>(swizzle);
  key[2] = static_cast<uint64_t>(rank);
  key[3] = reinterpret_cast<uintptr_t>(base);
  for (int d = 0; d < rank; ++d) {
    key[4 + d] = dims[d];
    key[4 + kMaxRank + d] = d + 1 < rank ? byte_strides[d] : 0;
    key[4 + 2 * kMaxRank + d] = box[d];
  }
  static std::mutex mutex;
  static std::unordered_map<Key, Entry, KeyHash> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) {
      if (it->second.ok) std::memcpy(map, &it->second.map, sizeof(CUtensorMap));
      return it->second.ok;
    }
  }
  Entry entry{};
  entry.ok = encode_into(&entry.map);
  if (entry.ok) std::memcpy(map, &entry.map, sizeof(CUtensorMap));
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= kMaxEntries) cache.clear();
  cache.emplace(key, entry);
  return entry.ok;
}

}  // namespace mla::sm90
