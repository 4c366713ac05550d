// Late binding of OpenCL: the library links no libOpenCL; the backend
// dlopens the ICD loader the first time backend=opencl is asked for.
#ifndef DIFFLITE_OPENCL_CL_LOADER_H_
#define DIFFLITE_OPENCL_CL_LOADER_H_

#include <string>

#include "difflite/gpu_api.h"

namespace difflite::gpu {

// The process-wide function table, filled once (thread-safe). Returns nullptr
// and a one-line *error when no OpenCL library loads or a symbol is missing.
// Tried in order: $DIFFLITE_OPENCL_LIBRARY (only that, when set),
// libOpenCL.so.1, libOpenCL.so, and on Android the vendor/system paths.
const ClApi* LoadOpenCl(std::string* error);

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_CL_LOADER_H_
