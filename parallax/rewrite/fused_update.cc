// An optimizer's element-wise update of one variable as one TensorFlow op (built by parallax/comm/native.py;
// the graph is rewritten to use it by parallax/rewrite/fused_updates.py).
//
// Keras 3's optimizers update a variable with a dozen element-wise ops (Adam: the gradient minus the first
// moment, times a scalar, added to it; the same for the second moment with the squared gradient; a square
// root, a division, a subtraction from the variable). Each op reads and writes whole tensors of the variable's
// shape: for a 20,000 x 64 table, a dozen passes over 5 MB each step, where one pass over the variable, its
// slots and its gradient does. ParallaxFusedUpdate makes that one pass: it calls a function compiled for the
// chain (parallax/rewrite/fused_programs.py writes its C++: each of TensorFlow's element-wise ops as the same
// IEEE operation on the same two numbers, compiled without fused multiply-adds, so the results are
// TensorFlow's to the bit) on blocks of elements, on TensorFlow's threads (which flush denormals to zero, as
// they do for TensorFlow's own kernels), and writes the variables in place.
//
// Inputs: `variables` (K resource handles: the variable and its slots), `inputs` (N tensors of type T: the
// gradient, scalars) and `ids` (M index tensors). `kinds`: for each input, 1 where it has the variables' number of
// elements, 0 where it has one (a scalar), 2 where it is the rows of a sparse gradient, which the function sums
// into the variable's rows by the indices `ids[sparse[j]]` (the j-th such input), as UnsortedSegmentSum would:
// each element from zero, the rows in their order, a negative index left out. `writes`: the variables the function
// writes, in the order of its targets. The function, `symbol` of the shared library `library`, is called as
// fn(sources, targets, rows, width, begin, end): sources are the K variables' data then the N inputs' (a scalar's
// one element), targets the written variables' buffers, rows two arrays for each sparse input (where each row's
// positions start, rows + 1 of them; the positions, in order), width the elements of a row of the variables; it
// computes elements [begin, end), whole rows where there are sparse inputs. The variables are locked, in address
// order as TensorFlow's own updates lock several, for the op. A written variable whose buffer someone else holds (a read still alive) gets a new
// buffer, as TensorFlow's copy-on-write update does; else it is written in place (the function reads each
// element of its sources before it writes that element).

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

using UpdateFn = void (*)(const void* const* sources, void* const* targets, const int64_t* const* rows,
                          int64_t width, int64_t begin, int64_t end);

constexpr int64_t kBlock = 4096;  // elements a unit of the thread pool's work

REGISTER_OP("ParallaxFusedUpdate")
    .Input("variables: K * resource")
    .Input("inputs: N * T")
    .Input("ids: M * Tindices")
    .Attr("T: {float, double}")
    .Attr("Tindices: {int32, int64} = DT_INT32")
    .Attr("K: int >= 1")
    .Attr("N: int >= 0")
    .Attr("M: int >= 0")
    .Attr("kinds: list(int)")
    .Attr("sparse: list(int)")
    .Attr("writes: list(int)")
    .Attr("library: string")
    .Attr("symbol: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

// Each library opened once a process (and never closed: the kernels keep its function).
UpdateFn Load(const std::string& library, const std::string& symbol, std::string* error) {
  static std::mutex mu;
  static std::map<std::string, void*>* opened = new std::map<std::string, void*>();
  std::lock_guard<std::mutex> lock(mu);
  void*& handle = (*opened)[library];
  if (handle == nullptr) handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? why : "dlopen failed";
    opened->erase(library);
    return nullptr;
  }
  void* found = dlsym(handle, symbol.c_str());
  if (found == nullptr) *error = "no symbol " + symbol + " in " + library;
  return reinterpret_cast<UpdateFn>(found);
}

template <typename T>
class ParallaxFusedUpdateOp : public tensorflow::OpKernel {
 public:
  explicit ParallaxFusedUpdateOp(tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    std::string library, symbol, error;
    OP_REQUIRES_OK(context, context->GetAttr("K", &num_variables_));
    OP_REQUIRES_OK(context, context->GetAttr("N", &num_inputs_));
    OP_REQUIRES_OK(context, context->GetAttr("kinds", &kinds_));
    OP_REQUIRES_OK(context, context->GetAttr("sparse", &sparse_));
    OP_REQUIRES_OK(context, context->GetAttr("writes", &writes_));
    OP_REQUIRES_OK(context, context->GetAttr("library", &library));
    OP_REQUIRES_OK(context, context->GetAttr("symbol", &symbol));
    fn_ = Load(library, symbol, &error);
    OP_REQUIRES(context, fn_ != nullptr,
                tensorflow::errors::NotFound("ParallaxFusedUpdate: cannot load the update's code: ", error));
    for (int64_t k : writes_) {
      OP_REQUIRES(context, k >= 0 && k < num_variables_,
                  tensorflow::errors::InvalidArgument("ParallaxFusedUpdate: writes variable ", k, " of ",
                                                      num_variables_));
    }
  }

  void Compute(tensorflow::OpKernelContext* context) override {
    const int sources = num_variables_ + num_inputs_;
    OP_REQUIRES(context, static_cast<int>(kinds_.size()) == num_inputs_,
                tensorflow::errors::InvalidArgument("ParallaxFusedUpdate: ", kinds_.size(), " kinds for ",
                                                    num_inputs_, " inputs"));
    std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> variables(num_variables_);
    for (int k = 0; k < num_variables_; ++k) {
      OP_REQUIRES_OK(context, LookupResource(context, HandleFromInput(context, k), &variables[k]));
    }
    std::vector<tensorflow::mutex*> locks;
    for (auto& v : variables) locks.push_back(v->mu());
    std::sort(locks.begin(), locks.end());
    locks.erase(std::unique(locks.begin(), locks.end()), locks.end());
    std::vector<std::unique_ptr<tensorflow::mutex_lock>> held;
    for (auto* mu : locks) held.push_back(std::make_unique<tensorflow::mutex_lock>(*mu));

    const tensorflow::Tensor& first = *variables[0]->tensor();
    const int64_t n = first.NumElements();
    const int64_t rows = first.dims() > 0 ? first.dim_size(0) : 1;
    const int64_t width = rows > 0 ? n / rows : 0;
    std::vector<const void*> data(sources, nullptr);
    for (int s = 0; s < sources; ++s) {
      const tensorflow::Tensor* t = &context->input(s);
      int64_t expected = n;
      if (s < num_variables_) {
        OP_REQUIRES(context, variables[s]->is_initialized,
                    tensorflow::errors::FailedPrecondition("ParallaxFusedUpdate: variable ", s,
                                                           " is not initialised"));
        t = variables[s]->tensor();
        OP_REQUIRES(context, t->dtype() == tensorflow::DataTypeToEnum<T>::v(),
                    tensorflow::errors::InvalidArgument("ParallaxFusedUpdate: variable ", s, " is of type ",
                                                        tensorflow::DataTypeString(t->dtype())));
      } else if (kinds_[s - num_variables_] == 0) {
        expected = 1;
      } else if (kinds_[s - num_variables_] == 2) {
        expected = -1;  // checked with its indices below
      }
      OP_REQUIRES(context, expected < 0 || t->NumElements() == expected,
                  tensorflow::errors::InvalidArgument("ParallaxFusedUpdate: source ", s, " has ", t->NumElements(),
                                                      " elements, not ", expected));
      data[s] = t->flat<T>().data();
    }
    // each index tensor's rows: where each row's positions start, and the positions in their order
    const int num_ids = context->num_inputs() - sources;
    std::vector<std::vector<int64_t>> starts(num_ids), positions(num_ids);
    for (int m = 0; m < num_ids; ++m) {
      const tensorflow::Tensor& ids = context->input(sources + m);
      const int64_t count = ids.NumElements();
      std::vector<int64_t>& start = starts[m];
      start.assign(rows + 1, 0);
      for (int64_t q = 0; q < count; ++q) {
        const int64_t row = ids.dtype() == tensorflow::DT_INT32 ? ids.flat<int32_t>()(q) : ids.flat<int64_t>()(q);
        if (row < 0) continue;  // UnsortedSegmentSum leaves it out
        OP_REQUIRES(context, row < rows,
                    tensorflow::errors::InvalidArgument("ParallaxFusedUpdate: index ", row, " of a sparse gradient is"
                                                        " out of range [0, ", rows, ")"));
        ++start[row + 1];
      }
      for (int64_t r = 0; r < rows; ++r) start[r + 1] += start[r];
      positions[m].resize(start[rows]);
      std::vector<int64_t> next(start.begin(), start.end() - 1);
      for (int64_t q = 0; q < count; ++q) {
        const int64_t row = ids.dtype() == tensorflow::DT_INT32 ? ids.flat<int32_t>()(q) : ids.flat<int64_t>()(q);
        if (row >= 0) positions[m][next[row]++] = q;
      }
    }
    std::vector<const int64_t*> row_arrays;
    for (size_t j = 0, i = 0; i < kinds_.size(); ++i) {
      if (kinds_[i] != 2) continue;
      OP_REQUIRES(context, j < sparse_.size() && sparse_[j] >= 0 && sparse_[j] < num_ids,
                  tensorflow::errors::InvalidArgument("ParallaxFusedUpdate: sparse input ", i, " has no indices"));
      const int m = static_cast<int>(sparse_[j++]);
      const tensorflow::Tensor& values = context->input(num_variables_ + static_cast<int>(i));
      OP_REQUIRES(context, values.NumElements() == context->input(sources + m).NumElements() * width,
                  tensorflow::errors::InvalidArgument("ParallaxFusedUpdate: sparse input ", i, " has ",
                                                      values.NumElements(), " elements for ",
                                                      context->input(sources + m).NumElements(), " rows of ", width));
      row_arrays.push_back(starts[m].data());
      row_arrays.push_back(positions[m].data());
    }
    std::vector<void*> targets(writes_.size(), nullptr);
    std::vector<tensorflow::Tensor> fresh(writes_.size());
    std::vector<bool> copied(writes_.size(), false);
    for (size_t j = 0; j < writes_.size(); ++j) {
      tensorflow::Tensor* value = variables[writes_[j]]->tensor();
      if (value->RefCountIsOne()) {
        targets[j] = value->flat<T>().data();
      } else {
        OP_REQUIRES_OK(context, context->allocate_temp(value->dtype(), value->shape(), &fresh[j]));
        targets[j] = fresh[j].flat<T>().data();
        copied[j] = true;
      }
    }
    if (n > 0) {
      const UpdateFn fn = fn_;
      // a unit of work: whole rows where rows are summed, about kBlock elements
      const int64_t block = row_arrays.empty() ? kBlock : width * std::max<int64_t>(1, kBlock / width);
      const int64_t blocks = (n + block - 1) / block;
      auto run = [&](int64_t first, int64_t last) {
        fn(data.data(), targets.data(), row_arrays.data(), width, first * block, std::min(n, last * block));
      };
      auto* workers = context->device()->tensorflow_cpu_worker_threads()->workers;
      if (blocks > 1 && workers != nullptr) {
        workers->ParallelFor(blocks, block * 8 * static_cast<int64_t>(sources + writes_.size()), run);
      } else {
        run(0, blocks);
      }
    }
    for (size_t j = 0; j < writes_.size(); ++j) {
      if (copied[j]) *variables[writes_[j]]->tensor() = fresh[j];
    }
  }

 private:
  int num_variables_ = 0;
  int num_inputs_ = 0;
  std::vector<int64_t> kinds_;
  std::vector<int64_t> sparse_;
  std::vector<int64_t> writes_;
  UpdateFn fn_ = nullptr;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("ParallaxFusedUpdate").Device(tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
                        ParallaxFusedUpdateOp<float>);
REGISTER_KERNEL_BUILDER(Name("ParallaxFusedUpdate").Device(tensorflow::DEVICE_CPU).TypeConstraint<double>("T"),
                        ParallaxFusedUpdateOp<double>);
