#pragma once
// The two additions autograd itself performs, outside the graph:
//   add_into(dst, src)  dst += src in place (a leaf's .grad; src converted to dst's dtype)
//   sum_of(a, b)        a new tensor a + b (a node receiving gradients from several uses)
// On CUDA both run on the framework stream; neither records anything for autograd.
#include "core/tensor.h"

namespace mt {

void add_into(const Tensor& dst, const Tensor& src);
Tensor sum_of(const Tensor& a, const Tensor& b);

}  // namespace mt
