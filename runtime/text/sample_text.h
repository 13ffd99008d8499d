// The embedded training text for the synthetic vocab's BPE merges (English prose, Chinese prose,
// C++ and Python code, numbers), written for tessera.
#pragma once
#include <string_view>

namespace tessera::text {

// A few KB of mixed-language text; the same bytes in every build.
std::string_view bpe_training_sample();

}  // namespace tessera::text
