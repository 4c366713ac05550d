// Static placement of a partition's device tensors: offsets in one arena (the
// smallest footprint; what `difflite inspect` reports) or shared objects (what
// the OpenCL backend allocates: whole buffers, no sub-buffers).
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
