// Static placement of a partition's device tensors into one arena.
#ifndef DIFFLITE_OPENCL_MEMORY_PLAN_H_
#define DIFFLITE_OPENCL_MEMORY_PLAN_H_

#include <cstddef>
#include <vector>

namespace difflite::gpu {

// One buffer to place: live from step `first` to step `last` (inclusive).
struct PlanItem {
  size_t bytes = 0;
  int first = 0;
  int last = 0;
  size_t offset = 0;  // set by PlanArena
};

// Greedy by size: items in decreasing size (ties: earlier first), each put at
// the lowest-waste gap (best fit, else the end) among the already placed items
// whose lifetimes overlap its own. Offsets are multiples of `align`. Returns
// the arena size (0 for no items).
size_t PlanArena(std::vector<PlanItem>* items, size_t align);

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_MEMORY_PLAN_H_
