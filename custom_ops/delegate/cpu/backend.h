// The CPU backend (backend=cpu), in the OpenCL backend's shape (delegate/opencl/), its parts:
//   claim.cc            Delegate::Prepare: the nodes it runs, partitions asked of TFLite
//   quantized_claim.cc  the builtins it runs on quantized weights, and their folded chains
//   partition_plan.cc   a partition's Prepare: shapes, the intermediates' space
//   partition.cc        a partition kernel: Init, Invoke (runs the ops), its registration
//
// Flow:
//  1. claim.cc walks the execution plan and claims every CUSTOM node
//     whose custom_code names a difflite op, whose attributes parse and whose
//     tensors pass the op's shape/type check. A refused node gets a one-line
//     reason (stderr and context->ReportError) and stays with TFLite. First,
//     it claims the FULLY_CONNECTED and CONV_2D nodes whose weight is a quantized
//     constant, with that weight's folded chain (quantized_claim.h: the integers are
//     read as stored, no float copy of the weight exists); a WinogradConv3x3
//     whose w is a quantized 3x3 filter is among them (run as that CONV_2D),
//     and the custom-op walk skips it.
//     Claimed nodes go to ReplaceNodeSubsetsWithDelegateKernels, which groups
//     connected claimed nodes into partitions (one macro-node each).
//  2. Each partition is a Partition (partition.cc, Init): its nodes in plan order.
//     partition_plan.cc (Prepare) infers every shape in order, resizes the partition's
//     output tensors, and sizes the buffers of the tensors that flow between
//     two nodes of the partition: the interpreter does not allocate those as
//     such, so the delegate makes them the partition node's temporaries (TFLite's
//     arena holds them during its Invoke only; a runtime that gives them no
//     buffer gets the delegate's own, shared by lifetime). The output of a folded node has no storage at all:
//     inside a partition nothing is sized for it, and as a partition output it
//     is given 0 bytes and no data (quantized_claim.cc says why that is safe).
//  3. partition.cc (Invoke) runs the nodes in order (folded ones run nothing).
#ifndef DIFFLITE_DELEGATE_CPU_BACKEND_H_
#define DIFFLITE_DELEGATE_CPU_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "delegate_util.h"
#include "difflite/op_api.h"
#include "difflite/tflite_abi.h"

namespace difflite::cpu {

struct PartitionNode {
  int node_index = -1;
  std::string name;
  std::unique_ptr<OpInstance> op;
  std::vector<int> inputs;
  std::vector<int> outputs;
  // A folded node of a quantized weight's chain: runs nothing, its outputs have no storage.
  bool folded = false;
  // A builtin reading a quantized weight: the input (>= 0) it reads from the model's integers,
  // never from its tensor, and what Infer sees of it; builtins may omit optional inputs (-1).
  int fixed_input = -1;
  TensorInfo fixed_info;
  bool builtin = false;
  // What Infer checked at the last Prepare: Invoke runs the op on exactly these shapes.
  std::vector<TensorInfo> in_info;
  std::vector<TensorInfo> out_info;
};

struct OwnedTensor {
  TensorInfo info;
  size_t bytes = 0;
  size_t offset = 0;  // in 4-byte words, into Partition::storage
  // positions in Partition::nodes of its writer and of its last reader (set in Prepare)
  size_t first = 0;
  size_t last = 0;
};

struct Partition {
  DelegateState* state = nullptr;
  std::shared_ptr<LoraSlots> lora;       // the delegate's (ops hold their LoRA slots there)
  std::vector<PartitionNode> nodes;
  std::set<int> outputs;                 // interpreter-visible outputs
  std::map<int, TensorInfo> produced;    // inferred infos, set in Prepare
  std::map<int, OwnedTensor> owned;      // delegate-owned intermediates
  // Where the runtime gives them no buffer (TFLite does: they are the node's temporaries), one of
  // ours shared by lifetime (PlanOwned: `words`), made at the first such Invoke, NaN-poisoned.
  size_t words = 0;
  std::vector<uint32_t> storage;
  std::set<int> unallocated;             // outputs of folded nodes: no storage anywhere
  std::string init_error;
};

// claim.cc: Delegate::Prepare of backend=cpu.
tfl::Status PrepareDelegate(tfl::Context* ctx, tfl::Delegate* delegate);

// partition_plan.cc: a partition's Prepare (shapes checked by each op's Infer, outputs resized,
// intermediates sized and placed).
tfl::Status PlanPartition(tfl::Context* ctx, tfl::Node* node, Partition* p);

// partition.cc: the registration of the partition kernel.
tfl::Registration PartitionRegistration();

}  // namespace difflite::cpu

#endif  // DIFFLITE_DELEGATE_CPU_BACKEND_H_
