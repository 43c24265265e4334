// Parallax's in-graph MPI all-reduce as a TensorFlow op (built by parallax/comm/native.py).
//
// ParallaxMpiAllreduce sums each of its inputs over the processes of one communicator, in place
// when TensorFlow lets it have the input's buffer (the graph hands it gradients nobody else holds)
// and in a new one otherwise, in pieces of at most `chunk_bytes`. It does what the `mpi` backend's
// PyFunc does, without Python: no GIL, no numpy views. The communicator is looked up by the key
// `comm`, which the process registers with parallax_register_comm() before the graph runs (a
// communicator is a process's own, so the graph names it rather than holding it).
//
// A buffer of at least `huge_page_bytes` is first advised to use 2 MiB pages (the whole 2 MiB pages
// inside it; MADV_HUGEPAGE, and MADV_COLLAPSE the first time its address is seen). Open MPI's
// single-copy transfer between the ranks of a host (CMA) walks the peer's buffer page by page:
// numpy asks for huge pages for large arrays, TensorFlow's allocator does not, and on 4 KiB
// pages 16 MB took 1.6-2x as long (docs/benchmarks.md). TensorFlow reuses a gradient's address
// step after step, so the collapse (a copy) happens once per buffer.
//
// Inputs under `fuse_below` bytes (two or more, of the first one's dtype) are summed together, in
// one call over one buffer, each at an offset rounded up to 64 bytes (TensorFlow's alignment, so
// each output is a view of the buffer): an MPI call costs a fixed ~15-30 us on one host, about
// what copying 1 MiB costs. parallax/comm/mpi.py's fused_layout() is the same rule for the PyFunc.
// When TensorFlow's allocator has already put them back to back at exactly those offsets, and
// they are ours to overwrite, the op sums them where they lie: the same call, without the copy.
//
// float16 and bfloat16 inputs (CommunicationConfig.compression) travel as 16-bit words and are summed
// with an MPI operation of our own: each pair of values added in float32, the sum rounded to the
// format (to nearest, ties to even: what numpy and ml_dtypes do in the PyFunc's operation).
//
// A communicator registered with a spin of 0 or more is first waited for asleep: an MPI_Ibarrier,
// tested for `spin_ns`, then between naps doubling from `first_nap_ns` to `longest_nap_ns`
// (parallax/comm/arrival.py says why; its arrive() is the same calls for the PyFunc).

#include <mpi.h>
#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "tensorflow/core/framework/allocator.h"  // kAllocatorAlignment
#include "tensorflow/core/framework/numeric_types.h"  // Eigen::half, Eigen::bfloat16
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

// A registered communicator, and how its members wait for each other (spin_ns < 0: they do not).
struct Registered {
  MPI_Comm comm;
  std::int64_t spin_ns;
  std::int64_t first_nap_ns;
  std::int64_t longest_nap_ns;
};

std::mutex comms_mutex;
std::map<std::string, Registered>& comms() {
  static auto* registered = new std::map<std::string, Registered>();
  return *registered;
}

// How often inputs summed together were summed where they lay (adjacent), and how often copied.
std::atomic<std::int64_t> fused_in_place{0};
std::atomic<std::int64_t> fused_copied{0};

// Wait for every member of `how.comm` without holding a core (see the file's comment).
tensorflow::Status Arrive(const Registered& how) {
  MPI_Request request;
  if (MPI_Ibarrier(how.comm, &request) != MPI_SUCCESS) {
    return tensorflow::errors::Internal("Parallax: MPI_Ibarrier failed");
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(how.spin_ns);
  std::int64_t nap_ns = how.first_nap_ns;
  while (true) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      return tensorflow::errors::Internal("Parallax: MPI_Test of the arrival barrier failed");
    }
    if (done) return tensorflow::OkStatus();
    if (how.spin_ns > 0 && std::chrono::steady_clock::now() < deadline) continue;
    std::this_thread::sleep_for(std::chrono::nanoseconds(nap_ns));
    nap_ns = std::min(nap_ns * 2, how.longest_nap_ns);
  }
}

MPI_Datatype mpi_type(tensorflow::DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_FLOAT: return MPI_FLOAT;
    case tensorflow::DT_DOUBLE: return MPI_DOUBLE;
    case tensorflow::DT_INT32: return MPI_INT32_T;
    case tensorflow::DT_INT64: return MPI_INT64_T;
    case tensorflow::DT_HALF:
    case tensorflow::DT_BFLOAT16: return MPI_UINT16_T;
    default: return MPI_DATATYPE_NULL;
  }
}

// inout[i] = in[i] + inout[i] for 16-bit floats of type T, added in float32 (an MPI_User_function).
template <typename T>
void SumSixteenBits(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

template <typename T>
MPI_Op CreateSum() {
  MPI_Op op;
  MPI_Op_create(&SumSixteenBits<T>, /*commute=*/1, &op);
  return op;
}

// The operation that sums `dtype` (made once, after MPI_Init: the op runs only once mpi4py has it).
MPI_Op sum_op(tensorflow::DataType dtype) {
  if (dtype == tensorflow::DT_HALF) {
    static const MPI_Op half = CreateSum<Eigen::half>();
    return half;
  }
  if (dtype == tensorflow::DT_BFLOAT16) {
    static const MPI_Op bfloat16 = CreateSum<Eigen::bfloat16>();
    return bfloat16;
  }
  return MPI_SUM;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older kernels answer EINVAL, which is harmless
#endif

// Ask for huge pages for the whole 2 MiB pages inside [data, data + bytes): nobody else's memory
// shares them. Advice only: the kernel may refuse, and the sums do not depend on it.
void advise_huge_pages(void* data, std::int64_t bytes) {
  constexpr std::uintptr_t kHuge = std::uintptr_t(2) << 20;
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t start = (begin + kHuge - 1) & ~(kHuge - 1);
  const std::uintptr_t end = (begin + static_cast<std::uintptr_t>(bytes)) & ~(kHuge - 1);
  if (end <= start) return;
  void* range = reinterpret_cast<void*>(start);
  // every call: cheap, and it marks again a range the allocator unmapped and mapped anew
  madvise(range, end - start, MADV_HUGEPAGE);
  static std::mutex mutex;
  static auto* collapsed = new std::set<std::uintptr_t>();
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (collapsed->size() > 4096) collapsed->clear();
    if (!collapsed->insert(start).second) return;
  }
  madvise(range, end - start, MADV_COLLAPSE);  // the pages the gradient already has, now
}

}  // namespace

extern "C" {
// Register (or replace) the communicator `key` names; `handle` is mpi4py's Comm.handle. With
// `spin_ns` >= 0 each call first waits for every member asleep (Arrive); < 0, it does not.
int parallax_register_comm(const char* key, std::intptr_t handle, std::int64_t spin_ns, std::int64_t first_nap_ns,
                           std::int64_t longest_nap_ns) {
  std::lock_guard<std::mutex> lock(comms_mutex);
  comms()[key] = Registered{reinterpret_cast<MPI_Comm>(handle), spin_ns, first_nap_ns, longest_nap_ns};
  return 0;
}

int parallax_unregister_comm(const char* key) {
  std::lock_guard<std::mutex> lock(comms_mutex);
  return comms().erase(key) ? 0 : 1;
}

// How many calls of this process summed their small inputs where they lay, and how many copied them.
void parallax_fused_counts(std::int64_t* in_place, std::int64_t* copied) {
  *in_place = fused_in_place.load();
  *copied = fused_copied.load();
}
}

REGISTER_OP("ParallaxMpiAllreduce")
    .Input("tensors: T")
    .Output("summed: T")
    .Attr("T: list({float, double, int32, int64, half, bfloat16})")
    .Attr("comm: string")
    .Attr("chunk_bytes: int = 2097152")
    .Attr("huge_page_bytes: int = 4194304")
    .Attr("fuse_below: int = 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
      return tensorflow::OkStatus();
    });

class ParallaxMpiAllreduceOp : public tensorflow::OpKernel {
 public:
  explicit ParallaxMpiAllreduceOp(tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("comm", &comm_key_));
    OP_REQUIRES_OK(context, context->GetAttr("chunk_bytes", &chunk_bytes_));
    OP_REQUIRES_OK(context, context->GetAttr("huge_page_bytes", &huge_page_bytes_));
    OP_REQUIRES_OK(context, context->GetAttr("fuse_below", &fuse_below_));
  }

  void Compute(tensorflow::OpKernelContext* context) override {
    Registered how;
    {
      std::lock_guard<std::mutex> lock(comms_mutex);
      auto found = comms().find(comm_key_);
      OP_REQUIRES(context, found != comms().end(),
                  tensorflow::errors::FailedPrecondition(
                      "Parallax: no MPI communicator registered as '", comm_key_,
                      "' (the graph ran before the backend bound it to this process)"));
      how = found->second;
    }
    const MPI_Comm comm = how.comm;
    if (how.spin_ns >= 0) OP_REQUIRES_OK(context, Arrive(how));
    const int count = static_cast<int>(context->num_outputs());
    std::vector<int> fused;  // the inputs summed together, in order
    for (int i = 0; i < count; ++i) {
      const tensorflow::Tensor& input = context->input(i);
      const auto bytes = static_cast<tensorflow::int64>(input.TotalBytes());
      if (bytes > 0 && bytes < fuse_below_ && (fused.empty() || input.dtype() == context->input(fused[0]).dtype())) {
        fused.push_back(i);
      }
    }
    if (fused.size() < 2) fused.clear();
    std::vector<bool> done(count, false);
    if (!fused.empty()) {
      SumFused(context, comm, fused);
      if (!context->status().ok()) return;
      for (int i : fused) done[i] = true;
    }
    for (int i = 0; i < count; ++i) {
      if (done[i]) continue;
      const tensorflow::Tensor& input = context->input(i);
      tensorflow::Tensor* output = nullptr;
      OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({i}, i, input.shape(), &output));
      if (output->data() != input.data() && input.TotalBytes() > 0) {
        std::memcpy(output->data(), input.data(), input.TotalBytes());  // not ours to sum in place
      }
      if (huge_page_bytes_ > 0 && static_cast<tensorflow::int64>(input.TotalBytes()) >= huge_page_bytes_) {
        advise_huge_pages(output->data(), input.TotalBytes());
      }
      OP_REQUIRES_OK(context, Sum(comm, output->data(), input.NumElements(), input.dtype()));
    }
  }

 private:
  // Sum `count` elements of `dtype` at `data` over `comm`, in place, in pieces of chunk_bytes_.
  tensorflow::Status Sum(MPI_Comm comm, void* data, tensorflow::int64 count, tensorflow::DataType dtype) const {
    const MPI_Datatype type = mpi_type(dtype);
    if (type == MPI_DATATYPE_NULL) {
      return tensorflow::errors::InvalidArgument("Parallax: cannot all-reduce ", DataTypeString(dtype));
    }
    const MPI_Op op = sum_op(dtype);
    const tensorflow::int64 itemsize = tensorflow::DataTypeSize(dtype);
    const tensorflow::int64 step = std::max<tensorflow::int64>(1, chunk_bytes_ / itemsize);
    char* bytes = static_cast<char*>(data);
    for (tensorflow::int64 at = 0; at < count; at += step) {
      const tensorflow::int64 n = std::min(step, count - at);
      const int rc = MPI_Allreduce(MPI_IN_PLACE, bytes + at * itemsize, static_cast<int>(n), type, op, comm);
      if (rc != MPI_SUCCESS) return tensorflow::errors::Internal("Parallax: MPI_Allreduce failed with code ", rc);
    }
    return tensorflow::OkStatus();
  }

  // The inputs `fused` summed with one call over one buffer (see the file's comment).
  void SumFused(tensorflow::OpKernelContext* context, MPI_Comm comm, const std::vector<int>& fused) {
    constexpr tensorflow::int64 kAlign = tensorflow::Allocator::kAllocatorAlignment;
    const tensorflow::DataType dtype = context->input(fused[0]).dtype();
    const tensorflow::int64 itemsize = tensorflow::DataTypeSize(dtype);
    std::vector<tensorflow::int64> offsets;
    tensorflow::int64 total = 0;
    for (int i : fused) {
      offsets.push_back(total);
      total += context->input(i).TotalBytes();
      total = (total + kAlign - 1) / kAlign * kAlign;
    }
    if (SumInPlaceIfAdjacent(context, comm, fused, offsets, total)) {
      ++fused_in_place;
      return;
    }
    ++fused_copied;
    tensorflow::Tensor buffer;
    OP_REQUIRES_OK(context, context->allocate_temp(dtype, tensorflow::TensorShape({total / itemsize}), &buffer));
    char* data = static_cast<char*>(const_cast<void*>(static_cast<const void*>(buffer.tensor_data().data())));
    for (size_t k = 0; k < fused.size(); ++k) {
      const tensorflow::Tensor& input = context->input(fused[k]);
      const tensorflow::int64 bytes = input.TotalBytes();
      std::memcpy(data + offsets[k], input.tensor_data().data(), bytes);
      const tensorflow::int64 end = k + 1 < fused.size() ? offsets[k + 1] : total;
      std::memset(data + offsets[k] + bytes, 0, end - offsets[k] - bytes);  // the padding sums to 0
    }
    if (huge_page_bytes_ > 0 && total >= huge_page_bytes_) advise_huge_pages(data, total);
    OP_REQUIRES_OK(context, Sum(comm, data, total / itemsize, dtype));
    for (size_t k = 0; k < fused.size(); ++k) {
      const tensorflow::Tensor& input = context->input(fused[k]);
      const tensorflow::int64 first = offsets[k] / itemsize;
      tensorflow::Tensor out;
      OP_REQUIRES(context, out.CopyFrom(buffer.Slice(first, first + input.NumElements()), input.shape()),
                  tensorflow::errors::Internal("Parallax: cannot view the fused buffer as ", input.shape().DebugString()));
      context->set_output(fused[k], out);
    }
  }

  // When TensorFlow's allocator has put the inputs `fused` back to back at exactly the offsets of
  // the fused layout (no padding anywhere, the last one ending the buffer) and every one of them is
  // ours to overwrite, sum them where they are: the same MPI call over the same bytes, without the
  // copy. Returns false, having changed nothing, when they are not.
  bool SumInPlaceIfAdjacent(tensorflow::OpKernelContext* context, MPI_Comm comm, const std::vector<int>& fused,
                            const std::vector<tensorflow::int64>& offsets, tensorflow::int64 total) {
    const char* base = context->input(fused[0]).tensor_data().data();
    for (size_t k = 0; k < fused.size(); ++k) {
      const tensorflow::Tensor& input = context->input(fused[k]);
      const tensorflow::int64 end = k + 1 < fused.size() ? offsets[k + 1] : total;
      if (input.tensor_data().data() != base + offsets[k] ||
          offsets[k] + static_cast<tensorflow::int64>(input.TotalBytes()) != end) {
        return false;
      }
    }
    std::vector<std::unique_ptr<tensorflow::Tensor>> owned;
    for (int i : fused) {
      const tensorflow::Tensor& input = context->input(i);
      owned.push_back(context->forward_input(i, i, input.dtype(), input.shape(), context->output_memory_type(i),
                                             context->output_alloc_attr(i)));
      if (!owned.back()) return false;  // somebody else holds it: copy
    }
    char* data = const_cast<char*>(base);
    if (huge_page_bytes_ > 0 && total >= huge_page_bytes_) advise_huge_pages(data, total);
    const tensorflow::DataType dtype = context->input(fused[0]).dtype();
    const tensorflow::Status summed = Sum(comm, data, total / tensorflow::DataTypeSize(dtype), dtype);
    if (!summed.ok()) {
      context->SetStatus(summed);
      return true;
    }
    for (size_t k = 0; k < fused.size(); ++k) context->set_output(fused[k], *owned[k]);
    return true;
  }

  std::string comm_key_;
  tensorflow::int64 chunk_bytes_;
  tensorflow::int64 huge_page_bytes_;
  tensorflow::int64 fuse_below_;
};

REGISTER_KERNEL_BUILDER(Name("ParallaxMpiAllreduce").Device(tensorflow::DEVICE_CPU), ParallaxMpiAllreduceOp);
