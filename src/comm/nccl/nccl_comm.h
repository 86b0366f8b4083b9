#pragma once
// The NCCL communicator: the data plane of the CUDA backend (Compute::data_communicator), and of
// the opaque test backend over the stand-in NCCL of the tests (docs/gpu.md, "Testing without
// GPUs"). No CUDA header here: the memory and streams it works on come through NcclDevice.
#include <memory>
#include <string>

#include "distmuon/comm.h"

namespace distmuon {

// How an NCCL communicator reaches its memory: the device it makes current and the streams it
// queues on. The CUDA backend's (src/compute/cuda) queues every operation on a communication
// stream ordered after the compute stream's work by an event, and the compute stream after it by
// another (a started operation: only once its request is waited); host_nccl_device() is host
// memory (the stand-in NCCL of the tests).
class NcclDevice {
 public:
  // Where a started operation (start_all_to_all_v) ends on the device: join() orders the work
  // queued next (the compute stream) after it, without a host wait. Destroyed after join(), or
  // unjoined when the communicator failed.
  class Completion {
   public:
    virtual ~Completion() = default;
    // Throws distmuon::Error naming op on a failed CUDA call.
    virtual void join(const char* op) = 0;
  };

  virtual ~NcclDevice() = default;
  // "device 0", "host memory": for messages.
  virtual std::string name() const = 0;
  // Makes the device current on the calling thread; throws distmuon::Error naming op.
  virtual void make_current(const char* op) = 0;
  // Before an NCCL call: the cudaStream_t to queue it on (ordered after the work queued so far).
  virtual void* begin_operation(const char* op) = 0;
  // After it was queued: the work queued next is ordered after it.
  virtual void end_operation(const char* op) = 0;
  // After a started operation was queued, instead of end_operation: the work queued next is not
  // ordered after it until the returned completion's join().
  virtual std::unique_ptr<Completion> end_started_operation(const char* op) = 0;
  // Whether everything queued has completed; throws distmuon::Error on a failed stream.
  virtual bool idle() = 0;
  // True for host memory the caller reads as soon as a call returns: every operation is waited
  // for (within the deadline) before it returns.
  virtual bool waits_each_operation() const = 0;
};

// Host memory, no streams: every operation waited for (the stand-in NCCL; docs/gpu.md).
std::shared_ptr<NcclDevice> host_nccl_device();

// An NCCL communicator over the ranks of `host`, on `device`. Making it is rank-local; its first
// collective connects it, collectively over host's ranks: every rank loads NCCL (agreed over host),
// rank 0 makes the unique id and broadcasts it over host, then every rank makes its device current
// and calls ncclCommInitRankConfig non-blocking, each step's failure on any rank agreed over host.
// split() connects this one and splits it with ncclCommSplit (non-blocking too).
//
// Every host wait (the connection, barrier, a device's waits_each_operation, nccl_wait) is
// bounded by nccl_timeout_seconds(): it polls ncclCommGetAsyncError and host's failure notices
// (CommImpl::post_notice) until the work completes. On an NCCL error, a peer's notice or the
// deadline, the rank posts a notice naming what failed, aborts the communicator (ncclCommAbort),
// collects the notices the other ranks post within a short grace, and throws: a CollectiveError
// when every rank answered (the same failing rank named on each), else distmuon::Error naming the
// ranks that did not answer (stalled or dead), so that the program ends the job. After a failure
// every operation throws the same error.
//
// start_all_to_all_v queues the exchange (ordered after the compute stream's work queued so far)
// and returns without waiting for it: on a device with streams, its request's wait() checks the
// communicator (NCCL's asynchronous error, the peers' notices; no host wait) and orders the
// compute stream after the exchange's event (NcclDevice::Completion::join), so a later host wait
// (nccl_wait) is the one bounded by the deadline; on host memory (waits_each_operation) wait()
// is the bounded host wait itself, until NCCL reports the communicator's queued work done.
std::shared_ptr<CommImpl> make_nccl_comm(std::shared_ptr<CommImpl> host,
                                         std::shared_ptr<NcclDevice> device);

// Waits, bounded as above, until everything queued on device completed and no NCCL communicator
// on it has failed (the CUDA backend's synchronize: a host wait with NCCL work in flight). Without
// an NCCL communicator on device: waits until device.idle(), unbounded.
void nccl_wait(NcclDevice& device, const char* what);

// The deadline of a host wait on NCCL, in seconds: DISTMUON_NCCL_TIMEOUT when set (a positive
// number), else 600 (PyTorch's default NCCL timeout). Throws distmuon::Error naming the variable
// on a value that is not a positive number.
double nccl_timeout_seconds();

// Whether this build has the NCCL communicator (built with DISTMUON_ENABLE_CUDA).
bool nccl_built();

}  // namespace distmuon
