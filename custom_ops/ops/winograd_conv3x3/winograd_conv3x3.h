// difflite.WinogradConv3x3: the op's name and the F(4x4, 3x3) sizes, shared
// by the CPU kernel (winograd_conv3x3.cc) and the GPU side
// (winograd_conv3x3_opencl.cc). The op has no attribute besides tile=4.
#ifndef DIFFLITE_OPS_WINOGRAD_CONV3X3_H_
#define DIFFLITE_OPS_WINOGRAD_CONV3X3_H_

namespace difflite {
namespace winograd {

constexpr const char* kOpName = "difflite.WinogradConv3x3";
constexpr int kTileOut = 4;                      // m in F(m x m, 3 x 3)
constexpr int kTileIn = 6;                       // m + r - 1
constexpr int kPositions = kTileIn * kTileIn;    // 36 transformed positions

}  // namespace winograd
}  // namespace difflite

#endif  // DIFFLITE_OPS_WINOGRAD_CONV3X3_H_
