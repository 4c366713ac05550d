"""The TFLite schema facts that both the writer and the readers of an output folder use: tensor
types in NumPy terms, and the one signature every difflite model carries."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

TFLITE_TYPES = {
    np.dtype(np.float32): schema.TensorType.FLOAT32,
    np.dtype(np.float16): schema.TensorType.FLOAT16,
    np.dtype(np.int32): schema.TensorType.INT32,
    np.dtype(np.int64): schema.TensorType.INT64,
    np.dtype(np.bool_): schema.TensorType.BOOL,
    np.dtype(np.int8): schema.TensorType.INT8,
    np.dtype(np.uint8): schema.TensorType.UINT8,
}
NUMPY_TYPES = {v: k for k, v in TFLITE_TYPES.items()}
SIGNATURE_KEY = "serving_default"
