// The one way an op of the library makes itself known, whatever it is: a difflite custom op's
// CPU kernel (OpDef, op_api.h), a GPU op of a builtin or a difflite op (gpu::GpuOpDef,
// gpu_api.h), or a CPU kernel of a TFLite builtin (cpu::QuantizedOpDef, cpu_builtins.h).
//
// The .cc that defines an op lists its definitions in a table at namespace scope and registers
// the table there:
//     const gpu::GpuOpDef kResizeOps[] = {
//         {"RESIZE_NEAREST_NEIGHBOR", &CreateResize},
//         {"RESIZE_BILINEAR", &CreateResize},
//     };
//     DIFFLITE_REGISTER_OPS(kResizeOps);
// and nothing else: no list elsewhere names it. The backends look ops up by name
// (OpRegistry<Def>::Find). Registration runs while the library loads (a static initializer of
// the .cc), so every op is registered before any lookup, and lookups need no lock. A later
// registration of a name replaces the earlier one.
#ifndef DIFFLITE_REGISTRY_H_
#define DIFFLITE_REGISTRY_H_

#include <cstddef>
#include <cstring>
#include <vector>

namespace difflite {

// Every definition of type Def (a struct whose `name` is a const char*), in registration order.
template <typename Def>
class OpRegistry {
 public:
  static void Add(const Def* def) {
    for (const Def*& d : Defs()) {
      if (std::strcmp(d->name, def->name) == 0) {
        d = def;
        return;
      }
    }
    Defs().push_back(def);
  }
  // nullptr when no op of that name is registered.
  static const Def* Find(const char* name) {
    if (name == nullptr) return nullptr;
    for (const Def* d : Defs()) {
      if (std::strcmp(d->name, name) == 0) return d;
    }
    return nullptr;
  }
  static const std::vector<const Def*>& All() { return Defs(); }

 private:
  // Never destroyed: a partition may look an op up while the process exits.
  static std::vector<const Def*>& Defs() {
    static auto* defs = new std::vector<const Def*>();
    return *defs;
  }
};

template <typename Def, size_t N>
bool RegisterOps(const Def (&defs)[N]) {
  for (const Def& d : defs) OpRegistry<Def>::Add(&d);
  return true;
}

}  // namespace difflite

#define DIFFLITE_REGISTRY_CONCAT2_(a, b) a##b
#define DIFFLITE_REGISTRY_CONCAT_(a, b) DIFFLITE_REGISTRY_CONCAT2_(a, b)
// Registers a table of op definitions (see above); at namespace scope in the op's .cc.
#define DIFFLITE_REGISTER_OPS(defs)                                                     \
  [[maybe_unused]] static const bool DIFFLITE_REGISTRY_CONCAT_(difflite_registered_, \
                                                               __LINE__) =          \
      ::difflite::RegisterOps(defs)

#endif  // DIFFLITE_REGISTRY_H_
