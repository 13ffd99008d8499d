// An early start's wait (docs/DECODE.md "Early start"; shaders/gate.glsl): a consumer recorded
// with no barrier after its producer polls word `word` of `words` until the producer's
// workgroups have counted it up to `target`, then reads the producer's output. A wait that gives
// up (a device that did not run the two side by side) writes 1 to `error` and the value it saw
// to the next word (8 bytes, host-visible: the decode step checks them after the step).
#pragma once
#include <cstdint>

#include "runtime/vulkan/memory.h"

namespace tessera::vk {

struct GateWait {
  BufferSlice words;
  uint32_t word = 0;    // the word polled (binding offsets must be aligned: the slice starts lower)
  uint32_t target = 0;  // arrivals that open it (above 0)
  BufferSlice error;
  bool enabled() const { return words.buffer != VK_NULL_HANDLE; }
  // The slices hold the words and the target is above 0.
  bool valid() const { return enabled() && words.size >= (word + 1) * 4ull && error.size >= 8 && target > 0; }
};

}  // namespace tessera::vk
