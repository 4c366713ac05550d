"""difflite compiler: diffusers pipeline -> ONNX -> fused passes -> .tflite output folder."""
