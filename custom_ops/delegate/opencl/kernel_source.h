// One kernel's program: the program text with every other `__kernel`
// function removed, so that a driver compiles only the kernel it is asked for.
// NVIDIA's OpenCL compiler runs builds mostly one at a time (H200, 2026-11: a
// 24 s cold claim for 163 s of build time summed over 16 threads): a
// start pays for every kernel of every .cl file it touches unless the unused
// ones are left out. Helpers, macros and types stay (unused ones cost little).
#ifndef DIFFLITE_OPENCL_KERNEL_SOURCE_H_
#define DIFFLITE_OPENCL_KERNEL_SOURCE_H_

#include <string>

namespace difflite::gpu {

// `text` without the `__kernel` functions (at the start of a line) whose name
// is not `kernel`; each removed function leaves its newlines, so line numbers
// in build logs stay those of the file. The text unchanged when `kernel` is
// not defined there as such (the build then reports the missing kernel).
std::string KeepOneKernel(const std::string& text, const std::string& kernel);

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_KERNEL_SOURCE_H_
