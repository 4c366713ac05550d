// Static placement of a partition's device tensors into whole buffers shared by
// lifetime (no sub-buffers). compiler/memory.py plans the same way, and also by
// offsets in one arena for comparison.
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
};

// Tensors sharing one buffer ("object") have disjoint lifetimes. Greedy by
// size: items in decreasing size, each into the smallest object it may share
// (every object is as large as its first, largest item), else a new object.
struct ObjectPlan {
  std::vector<size_t> object_of;     // per item
  std::vector<size_t> object_bytes;  // per object
  size_t total_bytes = 0;
};
ObjectPlan PlanSharedObjects(const std::vector<PlanItem>& items);

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_MEMORY_PLAN_H_
