#include "worker/backend/step_order.h"

namespace lazykv {

std::vector<size_t> PrefillStepOrder(std::span<const SequenceStep> steps, size_t few_max, size_t* many_first) {
  std::vector<size_t> order, few, many;
  size_t s = 0, few_with_tokens = 0;
  for (; s < steps.size() && steps[s].tokens.size() <= 1; ++s) order.push_back(s);  // the leading run
  for (; s < steps.size(); ++s) {
    const size_t n = steps[s].tokens.size();
    (n <= few_max ? few : many).push_back(s);
    few_with_tokens += n > 0 && n <= few_max ? 1 : 0;
  }
  *many_first = 0;
  if (few_max == 0 || few_with_tokens == 0 || many.empty()) {
    for (size_t i = order.size(); i < steps.size(); ++i) order.push_back(i);
    return order;
  }
  size_t with_tokens = few_with_tokens;
  for (size_t i : order) with_tokens += steps[i].tokens.empty() ? 0 : 1;
  *many_first = with_tokens;
  order.insert(order.end(), few.begin(), few.end());
  order.insert(order.end(), many.begin(), many.end());
  return order;
}

}  // namespace lazykv
