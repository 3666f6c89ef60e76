#include "exec/mpi_cluster.h"

// The C API only (Open MPI would otherwise pull in its C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"

namespace ucp::exec {
namespace {

absl::Status MpiError(int code, const char* what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return absl::InternalError(absl::StrCat("MPI ", what, " failed: ", std::string(text, len)));
}

// Waits for `request` without holding a core: a rank that finished its
// units (or waits for rank 0's plan) polls with growing sleeps instead of
// MPI's busy wait, which would take a core from the ranks still working
// on the same node (and, with several ranks per node, from their threads).
int PoliteWait(MPI_Request* request) {
  int done = 0;
  int64_t sleep_us = 20;
  while (true) {
    if (int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) return rc;
    if (done) return MPI_SUCCESS;
    timespec ts{0, static_cast<long>(sleep_us * 1000)};
    nanosleep(&ts, nullptr);
    sleep_us = std::min<int64_t>(sleep_us * 2, 2000);
  }
}

// Sends and receives counts as 64-bit values but MPI counts are ints: large
// messages go in pieces.
constexpr int64_t kMaxPiece = int64_t{1} << 30;

class MpiCluster : public Cluster {
 public:
  MpiCluster() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Errors come back as codes, not as the default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~MpiCluster() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status Broadcast(std::string* bytes, int root) override {
    int64_t n = static_cast<int64_t>(bytes->size());
    MPI_Request req;
    int rc = MPI_Ibcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD, &req);
    if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
    if (rc != MPI_SUCCESS) return MpiError(rc, "Bcast");
    bytes->resize(static_cast<size_t>(n));
    for (int64_t off = 0; off < n; off += kMaxPiece) {
      const int piece = static_cast<int>(std::min(kMaxPiece, n - off));
      rc = MPI_Ibcast(bytes->data() + off, piece, MPI_BYTE, root, MPI_COMM_WORLD, &req);
      if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
      if (rc != MPI_SUCCESS) return MpiError(rc, "Bcast");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> Gather(const std::string& mine, int root) override {
    const int64_t n = static_cast<int64_t>(mine.size());
    std::vector<int64_t> sizes(rank_ == root ? size_ : 0);
    MPI_Request req;
    int rc = MPI_Igather(&n, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, root, MPI_COMM_WORLD, &req);
    if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
    if (rc != MPI_SUCCESS) return MpiError(rc, "Gather");
    std::vector<std::string> out;
    if (rank_ == root) {
      out.resize(size_);
      for (int r = 0; r < size_; ++r) {
        if (r == root) {
          out[r] = mine;
          continue;
        }
        out[r].resize(static_cast<size_t>(sizes[r]));
        for (int64_t off = 0; off < sizes[r]; off += kMaxPiece) {
          const int piece = static_cast<int>(std::min(kMaxPiece, sizes[r] - off));
          rc = MPI_Irecv(out[r].data() + off, piece, MPI_BYTE, r, /*tag=*/7, MPI_COMM_WORLD, &req);
          if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
          if (rc != MPI_SUCCESS) return MpiError(rc, "Recv");
        }
      }
    } else {
      for (int64_t off = 0; off < n; off += kMaxPiece) {
        const int piece = static_cast<int>(std::min(kMaxPiece, n - off));
        rc = MPI_Isend(mine.data() + off, piece, MPI_BYTE, root, /*tag=*/7, MPI_COMM_WORLD, &req);
        if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
        if (rc != MPI_SUCCESS) return MpiError(rc, "Send");
      }
    }
    return out;
  }

  void Abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool LaunchedByMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

std::unique_ptr<Cluster> JoinMpiJobIfLaunched(int* argc, char*** argv) {
  if (!LaunchedByMpi()) return nullptr;
  int provided = 0;
  // Only the main thread calls MPI; the worker threads write files.
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  return std::make_unique<MpiCluster>();
}

}  // namespace ucp::exec
