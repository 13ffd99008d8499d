// Level (e) of `tessera verify`: N prompt tokens through the Vulkan runtime on the packed file
// against the CPU reference on the original GGUF. Reports max |Δ| (relative to the reference's
// largest logit), the mean and worst KL divergence KL(ref || gpu) per position, and top-1
// agreement, each against a threshold that depends on whether the file holds composed weights
// (they are rounded once more, to --composed-type; a near-tie expert choice can then flip).
#pragma once
#include <vector>

#include "convert/verify.h"

namespace tessera::model {

struct LogitsThresholds {
  double max_rel;   // max |gpu - ref| / max |ref|; <= 0: reported, not checked
  double mean_kl;   // mean over positions of KL(softmax(ref) || softmax(gpu)), nats
  double top1;      // fraction of positions whose argmax agrees
};
// Thresholds for a file with (composed) or without composed weights.
LogitsThresholds logits_thresholds(bool composed);

// Runs the comparison (device: Vulkan device number, -1 = best). Rows: one per measure.
std::vector<convert::VerifyRow> verify_logits(const convert::VerifyOptions& opt, int device);

}  // namespace tessera::model
