// Storage codecs and SIMD arithmetic shared by the native steps of lbm_jax
// (lbm_step.cc: the plain step; lbm_free_surface.cc: the free-surface step).
//
// Everything here is internal to one shared library: the names live in the
// namespace lbm_native and are inline, so both sources include this header.

#pragma once

#if !defined(__x86_64__) || !defined(__AVX2__) || !defined(__F16C__) || \
    !defined(__FMA__)
// lbm_jax checks the CPU before compiling; this stops any other build at once.
#error "the native steps need an x86-64 CPU with AVX2, FMA and F16C (-march=native)"
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace lbm_native {
namespace {  // internal linkage in each source: inlined as a source's own functions

namespace ffi = xla::ffi;

// ---------------------------------------------------------------- storage codecs
// Each codec converts 8 values (AVX) or 1 between storage and float32.
struct Fp32 {
  using T = float;
  static constexpr ffi::DataType kType = ffi::DataType::F32;
  static constexpr uintptr_t kStreamAlign = 32;
  static __m256 load8(const T* p) { return _mm256_loadu_ps(p); }
  static float load1(const T* p) { return *p; }
  static void store8(T* p, __m256 v) { _mm256_storeu_ps(p, v); }
  static void stream8(T* p, __m256 v) { _mm256_stream_ps(p, v); }
  static void store1(T* p, float v) { *p = v; }
};

inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The stores of a 16-bit codec C, from its encoders C::bits8 (8 values) and
// C::bits1 (one value).
template <class C>
struct Codec16 {
  using T = uint16_t;
  static constexpr uintptr_t kStreamAlign = 16;
  static void store8(T* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), C::bits8(v));
  }
  static void stream8(T* p, __m256 v) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), C::bits8(v));
  }
  static void store1(T* p, float v) { *p = C::bits1(v); }
};

// fp16s: IEEE float16 of x * 2^15 (mpjax.formats: scaled(float16, 15)); the
// products are exact, the conversions round to nearest even (F16C).
struct Fp16s : Codec16<Fp16s> {
  static constexpr ffi::DataType kType = ffi::DataType::F16;
  static __m256 load8(const T* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(0x1p-15f));
  }
  static float load1(const T* p) { return _cvtsh_ss(*p) * 0x1p-15f; }
  static __m128i bits8(__m256 v) {
    return _mm256_cvtps_ph(_mm256_mul_ps(v, _mm256_set1_ps(0x1p15f)),
                           _MM_FROUND_TO_NEAREST_INT);
  }
  static uint16_t bits1(float v) {
    return _cvtss_sh(v * 0x1p15f, _MM_FROUND_TO_NEAREST_INT);
  }
};

// bfloat16 as its 16-bit patterns (lbm_jax holds bfloat16 populations in uint16):
// decode is exact (the pattern shifted into the high half of a float32); encode
// rounds to nearest even on the bit pattern, as the bfloat16 cast does, and a NaN
// keeps its sign and top payload bits with the quiet bit set.
struct Bf16 : Codec16<Bf16> {
  static constexpr ffi::DataType kType = ffi::DataType::U16;
  static __m256 load8(const T* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float load1(const T* p) { return from_bits(static_cast<uint32_t>(*p) << 16); }
  static uint16_t bits1(float v) {
    const uint32_t u = to_bits(v);
    if (v != v) return static_cast<uint16_t>((u | 0x400000u) >> 16);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
  static __m128i bits8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    r = _mm256_srli_epi32(_mm256_blendv_epi8(r, quiet, nan), 16);
    // pack the eight 32-bit lanes (values < 2^16) into eight 16-bit ones
    const __m128i lo = _mm256_castsi256_si128(r);
    const __m128i hi = _mm256_extracti128_si256(r, 1);
    return _mm_packus_epi32(lo, hi);
  }
};

// fp16c: the 1-4-11 minifloat (bias 15, no Inf/NaN, saturating) of
// mpjax.formats, bit for bit: decode rebiases the exponent (subnormals as
// mantissa * 2^-25, exact); encode rounds the low 12 bits to nearest even, rounds
// subnormals by one float addition of 0.25 (whose ulp is the quantum 2^-25),
// saturates at 0x7FFF and maps NaN to +0x7FFF.
struct Fp16c : Codec16<Fp16c> {
  static constexpr ffi::DataType kType = ffi::DataType::U16;
  static float load1(const T* p) {
    const uint32_t c = *p;
    const uint32_t sign = (c >> 15) << 31;
    const uint32_t exp = (c >> 11) & 0xFu;
    const uint32_t man = c & 0x7FFu;
    if (exp == 0) return from_bits(sign | to_bits(static_cast<float>(man) * 0x1p-25f));
    return from_bits(sign | ((exp + 112u) << 23) | (man << 12));
  }
  static __m256 load8(const T* p) {
    const __m256i c = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(c, 15), 31);
    const __m256i exp = _mm256_and_si256(_mm256_srli_epi32(c, 11), _mm256_set1_epi32(0xF));
    const __m256i man = _mm256_and_si256(c, _mm256_set1_epi32(0x7FF));
    const __m256i normal = _mm256_or_si256(
        sign, _mm256_or_si256(
                  _mm256_slli_epi32(_mm256_add_epi32(exp, _mm256_set1_epi32(112)), 23),
                  _mm256_slli_epi32(man, 12)));
    const __m256 subv = _mm256_mul_ps(_mm256_cvtepi32_ps(man), _mm256_set1_ps(0x1p-25f));
    const __m256i sub = _mm256_or_si256(sign, _mm256_castps_si256(subv));
    const __m256i zero = _mm256_cmpeq_epi32(exp, _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, zero));
  }
  static uint16_t bits1(float v) {
    const uint32_t u = to_bits(v);
    uint32_t sign = u >> 31;
    const uint32_t a = u & 0x7FFFFFFFu;
    uint32_t mag;
    if ((a >> 23) < 113u) {
      mag = to_bits(from_bits(a) + 0.25f) - 0x3E800000u;
    } else {
      const uint32_t an = a - (112u << 23);
      mag = (an + 0x7FFu + ((an >> 12) & 1u)) >> 12;
    }
    if (mag > 0x7FFFu) mag = 0x7FFFu;
    if (a > 0x7F800000u) {
      mag = 0x7FFFu;
      sign = 0;
    }
    return static_cast<uint16_t>((sign << 15) | mag);
  }
  static __m128i bits8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    __m256i sign = _mm256_srli_epi32(u, 31);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i an = _mm256_sub_epi32(a, _mm256_set1_epi32(112 << 23));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(an, 12), _mm256_set1_epi32(1));
    const __m256i normal = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(an, _mm256_set1_epi32(0x7FF)), lsb), 12);
    const __m256 sumf = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(0.25f));
    const __m256i sub =
        _mm256_sub_epi32(_mm256_castps_si256(sumf), _mm256_set1_epi32(0x3E800000));
    const __m256i is_sub =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(113), _mm256_srli_epi32(a, 23));
    __m256i mag = _mm256_blendv_epi8(normal, sub, is_sub);
    mag = _mm256_min_epu32(mag, _mm256_set1_epi32(0x7FFF));
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(0x7FFF), nan);
    sign = _mm256_andnot_si256(nan, sign);
    const __m256i code = _mm256_or_si256(_mm256_slli_epi32(sign, 15), mag);
    return _mm_packus_epi32(_mm256_castsi256_si128(code),
                            _mm256_extracti128_si256(code, 1));
  }
};

// dst[z] = decoded src[z], z < n. Rows of 8 or more end with one vector that
// overlaps the previous one (it writes the same values again): no scalar tail.
template <class S>
inline void decode(const typename S::T* src, float* dst, int n) {
  if (n < 8) {
    for (int z = 0; z < n; ++z) dst[z] = S::load1(src + z);
    return;
  }
  for (int z = 0; z + 8 <= n; z += 8) _mm256_storeu_ps(dst + z, S::load8(src + z));
  if (n % 8) _mm256_storeu_ps(dst + n - 8, S::load8(src + n - 8));
}

// dst[z] = encoded src[z], z < n; non-temporal stores (no read for ownership of
// the destination) where dst is aligned for them.
template <class S>
inline void encode(const float* src, typename S::T* dst, int n) {
  if (n < 8) {
    for (int z = 0; z < n; ++z) S::store1(dst + z, src[z]);
    return;
  }
  if (reinterpret_cast<uintptr_t>(dst) % S::kStreamAlign == 0) {
    for (int z = 0; z + 8 <= n; z += 8) S::stream8(dst + z, _mm256_loadu_ps(src + z));
  } else {
    for (int z = 0; z + 8 <= n; z += 8) S::store8(dst + z, _mm256_loadu_ps(src + z));
  }
  if (n % 8) S::store8(dst + n - 8, _mm256_loadu_ps(src + n - 8));
}

// ---------------------------------------------------------------- the collision
// Arithmetic on one float (the tail of a row) or on 8 (AVX).
struct Scalar {
  using V = float;
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V set(float v) { return v; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V fma(V a, V b, V c) { return __builtin_fmaf(a, b, c); }
  static V sqrt(V a) { return __builtin_sqrtf(a); }
  static constexpr int width = 1;
};

struct Avx {
  using V = __m256;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set(float v) { return _mm256_set1_ps(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static constexpr int width = 8;
};

// f(std::integral_constant<int, 0>{}), ..., f(std::integral_constant<int, N - 1>{}):
// a loop unrolled at compile time, so lattice constants fold into the code.
template <class F, int... I>
__attribute__((always_inline)) inline void unroll(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
__attribute__((always_inline)) inline void unroll(F&& f) {
  unroll(f, std::make_integer_sequence<int, N>{});
}

}  // namespace
}  // namespace lbm_native
