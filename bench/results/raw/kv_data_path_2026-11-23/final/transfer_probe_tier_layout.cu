// Where does the chunk transfer's time go? Variants of a 64 MiB H2D/D2H between pinned
// 256 KiB pages (shuffled) and contiguous device memory.
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e)); std::exit(1);} } while (0)
template <typename F> double Med(F&& f, int reps = 30) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) { auto a = std::chrono::steady_clock::now(); f(); t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count()); }
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}
__global__ void GatherFromHost(char* dst, const char* const* srcs, size_t piece, int n) {
  // each CTA walks pieces; 16-byte loads
  for (int p = blockIdx.x; p < n; p += gridDim.x) {
    const int4* s = reinterpret_cast<const int4*>(srcs[p]);
    int4* d = reinterpret_cast<int4*>(dst + p * piece);
    for (size_t i = threadIdx.x; i < piece / 16; i += blockDim.x) d[i] = s[i];
  }
}
__global__ void ScatterToHost(char* const* dsts, const char* src, size_t piece, int n) {
  for (int p = blockIdx.x; p < n; p += gridDim.x) {
    const int4* s = reinterpret_cast<const int4*>(src + p * piece);
    int4* d = reinterpret_cast<int4*>(dsts[p]);
    for (size_t i = threadIdx.x; i < piece / 16; i += blockDim.x) d[i] = s[i];
  }
}
int main() {
  const size_t bytes = 64ull << 20;
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  char *pin, *dev, *dev2; CK(cudaMallocHost(&pin, bytes)); CK(cudaMalloc(&dev, bytes + 8192)); CK(cudaMalloc(&dev2, bytes));
  std::mt19937_64 rng(1);
  const double gb = bytes / 1e9;
  auto report = [&](const char* what, double s, double base) { std::printf("%-70s %8.3f ms %6.2f GB/s %5.1f%%\n", what, s * 1e3, gb / s, 100 * base / s); };
  double h2d = Med([&] { CK(cudaMemcpyAsync(dev, pin, bytes, cudaMemcpyHostToDevice, st)); CK(cudaStreamSynchronize(st)); });
  double d2h = Med([&] { CK(cudaMemcpyAsync(pin, dev, bytes, cudaMemcpyDeviceToHost, st)); CK(cudaStreamSynchronize(st)); });
  report("H2D contiguous memcpyAsync+sync", h2d, h2d);
  report("D2H contiguous memcpyAsync+sync", d2h, d2h);
  report("D2D 64MiB memcpy (for scale, vs H2D)", Med([&] { CK(cudaMemcpyAsync(dev2, dev, bytes, cudaMemcpyDeviceToDevice, st)); CK(cudaStreamSynchronize(st)); }), h2d);
  {
    // the embedded tier's layout: a 128-byte header, then the payload across shuffled 256 KiB pages
    const size_t page = 256 << 10, hdr = 128;
    const int n = (bytes + hdr + page - 1) / page;
    char* pages; CK(cudaMallocHost(&pages, n * page));
    std::vector<int> slot(n); std::iota(slot.begin(), slot.end(), 0); std::shuffle(slot.begin(), slot.end(), rng);
    std::vector<char*> hp; std::vector<size_t> sz;
    for (size_t at = 0, p = 0, len = page - hdr; at < bytes; at += len, len = page, ++p) {
      len = std::min(len, bytes - at);
      hp.push_back(pages + slot[p] * page + (p == 0 ? hdr : 0)); sz.push_back(len);
    }
    const int m = hp.size();
    for (size_t pad : {size_t(0), hdr, size_t(64), size_t(4096 - 128 + 128)}) {
      std::vector<void*> hd(m), dd(m); std::vector<const void*> hs(m), ds(m);
      for (int i = 0, off = 0; i < m; off += sz[i], ++i) { hd[i] = hp[i]; hs[i] = hp[i]; dd[i] = dev + pad + off; ds[i] = dd[i]; }
      for (auto order : {cudaMemcpySrcAccessOrderStream, cudaMemcpySrcAccessOrderAny}) {
        for (unsigned flags : {0u, unsigned(cudaMemcpyFlagPreferOverlapWithCompute)}) {
          cudaMemcpyAttributes a{}; a.srcAccessOrder = order; a.flags = flags; size_t ai = 0;
          char name[128];
          std::snprintf(name, sizeof name, "tier layout H2D batch %d pieces, device pad %zu, order %d flags %u", m, pad, int(order), flags);
          report(name, Med([&] { CK(cudaMemcpyBatchAsync(dd.data(), hs.data(), sz.data(), m, &a, &ai, 1, st)); CK(cudaStreamSynchronize(st)); }), h2d);
          std::snprintf(name, sizeof name, "tier layout D2H batch %d pieces, device pad %zu, order %d flags %u", m, pad, int(order), flags);
          report(name, Med([&] { CK(cudaMemcpyBatchAsync(hd.data(), ds.data(), sz.data(), m, &a, &ai, 1, st)); CK(cudaStreamSynchronize(st)); }), d2h);
        }
      }
    }
  }
  h2d = Med([&] { CK(cudaMemcpyAsync(dev, pin, bytes, cudaMemcpyHostToDevice, st)); CK(cudaStreamSynchronize(st)); });
  report("H2D contiguous again", h2d, h2d);
  // cost of a malloc/free async pair and a sync round trip
  cudaMemPool_t pool; CK(cudaDeviceGetDefaultMemPool(&pool, 0)); uint64_t thr = UINT64_MAX; CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  report("cudaMallocAsync+FreeAsync 64MiB + sync (vs H2D)", Med([&] { void* p; CK(cudaMallocAsync(&p, bytes + 4096, st)); CK(cudaFreeAsync(p, st)); CK(cudaStreamSynchronize(st)); }), h2d);
  report("empty stream sync (vs H2D)", Med([&] { CK(cudaStreamSynchronize(st)); }), h2d);
  return 0;
}
