// Per-kernel profile of a decoded token: GPU timestamps around every dispatch of the decode step
// (GpuModel::profile_step), grouped by kernel family, set against the token's measured time and
// its floor (bytes per token / measured read bandwidth).
//
//   std::vector<std::vector<vk::DispatchTiming>> steps = ...;   // several profiled tokens
//   TokenProfile p = summarize_profile(steps, token_wall_us, read_gbps, depth);
//   std::puts(profile_markdown(p).c_str());
//   write_text_file("prof.svg", profile_svg({p}, "GLM-4.7-Flash q4_0"));
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/vulkan/recorder.h"

namespace tessera::model {

// The median of v (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> v);
// a formatted by the printf format f (one double conversion), e.g. number_text("%.2f", v).
std::string number_text(const char* f, double a);
// A GB/s figure for the tables: three decimals below 10, one from 10 on.
std::string gbps_text(double gbps);

// The kernel family of a dispatch label: its words that do not name a tensor or a block, joined
// by '.': "matvec.q4_0.norm blk.3.attn_q_a.weight" -> "matvec.q4_0.norm",
// "attention blk.3. partial" -> "attention.partial", "moe_gateup blk.1." -> "moe_gateup".
std::string kernel_family(std::string_view label);

struct KernelFamilyStats {
  std::string family;
  double calls_per_token = 0;   // dispatches of this family in one token
  double us_per_call = 0;       // median over every call of every profiled token
  double us_per_token = 0;      // median over tokens of the family's summed time
  double bytes_per_call = 0;    // mean bytes the family's kernels declare per call
  double gbps = 0;              // bytes / time over all calls (GB/s, 1e9 B/s)
  double share = 0;             // us_per_token / the token's kernel time (0..1)
};

struct TokenProfile {
  std::string what = "decoded token";  // the profiled step: "decoded token", "prefill chunk of 64 tokens"
  uint32_t depth = 0;             // context positions cached before the profiled token
  int tokens = 0;                 // profiled tokens summarized
  std::vector<KernelFamilyStats> families;  // most time first
  double kernel_us = 0;           // median over tokens of the summed dispatch times
  double token_us = 0;            // median measured time of a decoded token (host clock, submit to done)
  double outside_us = 0;          // token_us - kernel_us: submission, waits, read-back
  uint64_t bytes_per_token = 0;   // bytes the token's kernels declare (weights, cache, activations)
  double read_gbps = 0;           // the device's measured read bandwidth used for the floor
  double floor_us = 0;            // bytes_per_token / read bandwidth
  uint32_t dispatches = 0;        // per token
};

// Summarizes profiled tokens (each the dispatch timings of one decode step; all of the same
// recording) with the measured token times. Throws Error(Runtime) when `steps` is empty or the
// steps disagree on their dispatch count.
TokenProfile summarize_profile(std::span<const std::vector<vk::DispatchTiming>> steps,
                               std::span<const double> token_wall_us, double read_gbps, uint32_t depth);

// The profile as a markdown table (one row per family) followed by the token's totals.
std::string profile_markdown(const TokenProfile& p);

// A standalone SVG: per profile (one per depth), horizontal bars of µs per token by kernel family,
// each labelled with its time and share, and a line with the token's total, floor and outside time.
std::string profile_svg(std::span<const TokenProfile> profiles, std::string_view title);

}  // namespace tessera::model
