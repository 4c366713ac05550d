// Static placement of a partition's device tensors into whole buffers shared by
// lifetime (no sub-buffers). compiler/memory.py plans the same way, and also by
// offsets in one arena for comparison.
#ifndef DIFFLITE_OPENCL_MEMORY_PLAN_H_
#define DIFFLITE_OPENCL_MEMORY_PLAN_H_

#include <cstddef>
#include <utility>
#include <vector>

namespace difflite::gpu {

// One buffer to place: live from step `first` to step `last` (inclusive).
struct PlanItem {
  size_t bytes = 0;
  int first = 0;
  int last = 0;
};

// Tensors sharing one buffer ("object") have disjoint lifetimes. Two greedy placements, the
// smaller kept: each item into the smallest object free for its lifetime that holds it, else the
// largest free one grown to it, else a new object; items taken by size (largest first: no object
// grows), or by breadth (the steps with the most live bytes first, their items largest first).
// By breadth, SDXL's UNet at 1024 x 1024 takes 136.6 MiB of fp16 tensors, the least whole
// buffers can (by size 151.6); SD 1.5's gains nothing.
struct ObjectPlan {
  std::vector<size_t> object_of;     // per item
  std::vector<size_t> object_bytes;  // per object
  size_t total_bytes = 0;
};
ObjectPlan PlanSharedObjects(const std::vector<PlanItem>& items);

// What each buffer of a plan holds when: the room the tensors leave an op's scratch.
class Occupancy {
 public:
  Occupancy(const std::vector<PlanItem>& items, const ObjectPlan& plan);
  // The sizes of the buffers that hold nothing at `step`, largest first.
  std::vector<size_t> IdleBytes(const ObjectPlan& plan, int step) const;

 private:
  bool Idle(size_t object, int step) const;
  std::vector<std::vector<std::pair<int, int>>> spans_;  // per object: its items' lifetimes
};

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_MEMORY_PLAN_H_
