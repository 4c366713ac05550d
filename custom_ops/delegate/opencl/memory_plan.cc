#include "memory_plan.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>

namespace difflite::gpu {

namespace {

bool Overlap(const PlanItem& a, const PlanItem& b) { return a.first <= b.last && b.first <= a.last; }

// Places item `idx` into the smallest object free for its lifetime that holds it, else the
// largest free one grown to it (its items still fit), else a new object.
void Place(const std::vector<PlanItem>& items, size_t idx, std::vector<std::vector<size_t>>* users,
           ObjectPlan* plan) {
  const PlanItem& it = items[idx];
  const size_t none = users->size();
  size_t fits = none, largest = none;
  for (size_t o = 0; o < users->size(); ++o) {
    const auto& u = (*users)[o];
    if (std::any_of(u.begin(), u.end(), [&](size_t v) { return Overlap(items[v], it); })) continue;
    const size_t bytes = plan->object_bytes[o];
    if (bytes >= it.bytes && (fits == none || bytes < plan->object_bytes[fits])) fits = o;
    if (largest == none || bytes > plan->object_bytes[largest]) largest = o;
  }
  size_t chosen = fits != none ? fits : largest;
  if (chosen == none) {
    users->emplace_back();
    plan->object_bytes.push_back(0);
  }
  const size_t bytes = std::max<size_t>(it.bytes, 4);
  if (plan->object_bytes[chosen] < bytes) {
    plan->total_bytes += bytes - plan->object_bytes[chosen];
    plan->object_bytes[chosen] = bytes;
  }
  (*users)[chosen].push_back(idx);
  plan->object_of[idx] = chosen;
}

ObjectPlan PlaceInOrder(const std::vector<PlanItem>& items, const std::vector<size_t>& order) {
  ObjectPlan plan;
  plan.object_of.assign(items.size(), 0);
  std::vector<std::vector<size_t>> users;  // items per object
  for (size_t idx : order) Place(items, idx, &users, &plan);
  return plan;
}

// Largest first (ties: the earlier first). No object ever grows: each is as large as its first item.
std::vector<size_t> BySize(const std::vector<PlanItem>& items) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].bytes != items[b].bytes) return items[a].bytes > items[b].bytes;
    return items[a].first < items[b].first;
  });
  return order;
}

// The steps with the most live bytes first, each step's items largest first: the items that
// make the peaks choose their buffers before the rest.
std::vector<size_t> ByBreadth(const std::vector<PlanItem>& items) {
  int steps = 0;
  for (const PlanItem& it : items) steps = std::max(steps, it.last + 1);
  std::vector<int64_t> delta(static_cast<size_t>(steps) + 1, 0);
  for (const PlanItem& it : items) {
    delta[static_cast<size_t>(it.first)] += static_cast<int64_t>(it.bytes);
    delta[static_cast<size_t>(it.last) + 1] -= static_cast<int64_t>(it.bytes);
  }
  std::vector<int64_t> live(static_cast<size_t>(steps), 0);
  int64_t sum = 0;
  for (int s = 0; s < steps; ++s) live[static_cast<size_t>(s)] = sum += delta[static_cast<size_t>(s)];
  std::vector<int> step_order(static_cast<size_t>(steps));
  std::iota(step_order.begin(), step_order.end(), 0);
  std::stable_sort(step_order.begin(), step_order.end(),
                   [&](int a, int b) { return live[static_cast<size_t>(a)] > live[static_cast<size_t>(b)]; });
  const std::vector<size_t> by_size = BySize(items);
  std::vector<bool> taken(items.size(), false);
  std::vector<size_t> order;
  order.reserve(items.size());
  for (int s : step_order) {
    if (order.size() == items.size()) break;
    for (size_t idx : by_size) {
      if (!taken[idx] && items[idx].first <= s && s <= items[idx].last) {
        taken[idx] = true;
        order.push_back(idx);
      }
    }
  }
  return order;
}

}  // namespace

ObjectPlan PlanSharedObjects(const std::vector<PlanItem>& items) {
  ObjectPlan by_size = PlaceInOrder(items, BySize(items));
  ObjectPlan by_breadth = PlaceInOrder(items, ByBreadth(items));
  return by_breadth.total_bytes < by_size.total_bytes ? by_breadth : by_size;
}

Occupancy::Occupancy(const std::vector<PlanItem>& items, const ObjectPlan& plan)
    : spans_(plan.object_bytes.size()) {
  for (size_t i = 0; i < items.size(); ++i) {
    spans_[plan.object_of[i]].push_back({items[i].first, items[i].last});
  }
}

bool Occupancy::Idle(size_t object, int step) const {
  return std::none_of(spans_[object].begin(), spans_[object].end(),
                      [&](const std::pair<int, int>& s) { return s.first <= step && step <= s.second; });
}

std::vector<size_t> Occupancy::IdleBytes(const ObjectPlan& plan, int step) const {
  std::vector<size_t> bytes;
  for (size_t o = 0; o < spans_.size(); ++o) {
    if (Idle(o, step)) bytes.push_back(plan.object_bytes[o]);
  }
  std::sort(bytes.begin(), bytes.end(), std::greater<size_t>());
  return bytes;
}

}  // namespace difflite::gpu
