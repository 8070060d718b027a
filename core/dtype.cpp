#include "core/dtype.h"

#include <string>

#include "core/error.h"

namespace mt {

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64})
    if (name == dtype_name(t)) return t;
  MT_THROW("dtype_from_name: unknown dtype '", name, "' (expected f64, f32, bf16, f16, i32 or i64)");
}

}  // namespace mt
