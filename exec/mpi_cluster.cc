#include "exec/mpi_cluster.h"

#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/phases.h"
#include "base/status_macros.h"
#include "exec/loopback_nodelay.h"

namespace ucp::exec {
namespace {

// The part of Open MPI's C ABI (its mpi.h, unchanged from 3.0 to 5.x) that ucp
// uses: handles are pointers to Open MPI's predefined objects, which libmpi
// exports as data symbols (MPI_COMM_WORLD is &ompi_mpi_comm_world).
struct ompi_communicator_t;
struct ompi_datatype_t;
struct ompi_request_t;
struct ompi_errhandler_t;
struct ompi_status_public_t;
using MPI_Comm = ompi_communicator_t*;
using MPI_Datatype = ompi_datatype_t*;
using MPI_Request = ompi_request_t*;
using MPI_Errhandler = ompi_errhandler_t*;
using MPI_Status = ompi_status_public_t;
constexpr int MPI_SUCCESS = 0;
constexpr int MPI_MAX_ERROR_STRING = 256;
constexpr int MPI_THREAD_FUNNELED = 1;
MPI_Status* const MPI_STATUS_IGNORE = nullptr;

// Open MPI's entry points and predefined handles, from dlopen/dlsym.
struct OpenMpi {
  int (*Init_thread)(int*, char***, int, int*);
  int (*Finalize)();
  int (*Comm_rank)(MPI_Comm, int*);
  int (*Comm_size)(MPI_Comm, int*);
  int (*Comm_set_errhandler)(MPI_Comm, MPI_Errhandler);
  int (*Error_string)(int, char*, int*);
  int (*Test)(MPI_Request*, int*, MPI_Status*);
  int (*Ibcast)(void*, int, MPI_Datatype, int, MPI_Comm, MPI_Request*);
  int (*Igather)(const void*, int, MPI_Datatype, void*, int, MPI_Datatype, int, MPI_Comm, MPI_Request*);
  int (*Irecv)(void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*);
  int (*Isend)(const void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*);
  int (*Abort)(MPI_Comm, int);
  MPI_Comm comm_world;
  MPI_Datatype byte;
  MPI_Datatype int64;
  MPI_Errhandler errors_return;
};

const OpenMpi* mpi = nullptr;  // set once by LoadOpenMpi, before any thread starts

constexpr char kInstallHint[] =
    "ucp runs under mpirun with Open MPI (3.0 or later): install it (Debian/Ubuntu: apt install "
    "openmpi-bin; RHEL/Rocky: dnf install openmpi, then module load mpi/openmpi-x86_64), make "
    "libmpi.so.40 findable (LD_LIBRARY_PATH, or mpirun --prefix), or set UCP_MPI_LIBRARY to its path";

absl::StatusOr<const OpenMpi*> LoadOpenMpi() {
  const char* forced = std::getenv("UCP_MPI_LIBRARY");
  std::vector<std::string> candidates;
  if (forced != nullptr && *forced != '\0') {
    candidates.push_back(forced);
  } else {
    candidates = {"libmpi.so.40", "libmpi.so"};
  }
  void* handle = nullptr;
  std::string tried, loaded_name;
  for (const std::string& name : candidates) {
    // RTLD_GLOBAL: Open MPI's components (dlopened by libmpi) resolve
    // libmpi's symbols through the global scope.
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle != nullptr) {
      loaded_name = name;
      break;
    }
    const char* why = dlerror();
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", why != nullptr ? why : name);
  }
  const std::string launcher = MpiLauncherVariable();
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "launched by an MPI launcher (", launcher, " is set) but Open MPI's library cannot be loaded: ",
        tried, ". ", kInstallHint));
  }
  auto* m = new OpenMpi();
  std::string missing;
  auto sym = [&](const char* name) {
    void* p = dlsym(handle, name);
    if (p == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    return p;
  };
  m->Init_thread = reinterpret_cast<decltype(m->Init_thread)>(sym("MPI_Init_thread"));
  m->Finalize = reinterpret_cast<decltype(m->Finalize)>(sym("MPI_Finalize"));
  m->Comm_rank = reinterpret_cast<decltype(m->Comm_rank)>(sym("MPI_Comm_rank"));
  m->Comm_size = reinterpret_cast<decltype(m->Comm_size)>(sym("MPI_Comm_size"));
  m->Comm_set_errhandler = reinterpret_cast<decltype(m->Comm_set_errhandler)>(sym("MPI_Comm_set_errhandler"));
  m->Error_string = reinterpret_cast<decltype(m->Error_string)>(sym("MPI_Error_string"));
  m->Test = reinterpret_cast<decltype(m->Test)>(sym("MPI_Test"));
  m->Ibcast = reinterpret_cast<decltype(m->Ibcast)>(sym("MPI_Ibcast"));
  m->Igather = reinterpret_cast<decltype(m->Igather)>(sym("MPI_Igather"));
  m->Irecv = reinterpret_cast<decltype(m->Irecv)>(sym("MPI_Irecv"));
  m->Isend = reinterpret_cast<decltype(m->Isend)>(sym("MPI_Isend"));
  m->Abort = reinterpret_cast<decltype(m->Abort)>(sym("MPI_Abort"));
  m->comm_world = static_cast<MPI_Comm>(sym("ompi_mpi_comm_world"));
  m->byte = static_cast<MPI_Datatype>(sym("ompi_mpi_byte"));
  m->int64 = static_cast<MPI_Datatype>(sym("ompi_mpi_int64_t"));
  m->errors_return = static_cast<MPI_Errhandler>(sym("ompi_mpi_errors_return"));
  if (!missing.empty()) {
    char path[4096] = "";
    if (dlinfo(handle, RTLD_DI_ORIGIN, path) != 0) path[0] = '\0';
    delete m;
    return absl::FailedPreconditionError(absl::StrCat(
        "launched by an MPI launcher (", launcher, " is set) but ", loaded_name, " (from ", path,
        ") is not Open MPI's library (it lacks ", missing, "; MPICH and its derivatives have another ABI). ",
        kInstallHint));
  }
  return m;
}

absl::Status MpiError(int code, const char* what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (mpi->Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return absl::InternalError(absl::StrCat("MPI ", what, " failed: ", std::string(text, len),
                                          " (code ", code, ")"));
}

// Waits for `request` without holding a core: a rank that finished its
// units (or waits for rank 0's plan) polls with growing sleeps instead of
// MPI's busy wait, which would take a core from the ranks still working
// on the same node (and, with several ranks per node, from their threads).
int PoliteWait(MPI_Request* request) {
  PhaseTimer timer(Phase::kRanks);
  int done = 0;
  int64_t sleep_us = 20;
  while (true) {
    if (int rc = mpi->Test(request, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) return rc;
    if (done) return MPI_SUCCESS;
    timespec ts{0, static_cast<long>(sleep_us * 1000)};
    nanosleep(&ts, nullptr);
    sleep_us = std::min<int64_t>(sleep_us * 2, 2000);
  }
}

// Sends and receives counts as 64-bit values but MPI counts are ints: large
// messages go in pieces.
constexpr int64_t kMaxPiece = int64_t{1} << 30;

// The rank and the size of the job from the launcher's environment (Open
// MPI's mpirun sets both), or -1 when it does not say.
int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0' && n >= 0 && n <= std::numeric_limits<int>::max()) ? static_cast<int>(n) : -1;
}

// MPI_COMM_WORLD. MPI_Init_thread takes a tenth of a second even for two
// ranks on one node (more on many nodes), and ucp's first collective comes
// only once rank 0 has opened the source: so MPI starts on a thread of its
// own while the command opens the checkpoint, and every MPI call is made on
// that thread (MPI_THREAD_FUNNELED: the thread that initialized MPI makes
// all the calls, MPI_Finalize included). A call from the command's thread
// waits for the initialization, then for its turn.
class MpiCluster : public Cluster {
 public:
  MpiCluster() : env_rank_(EnvInt("OMPI_COMM_WORLD_RANK")), env_size_(EnvInt("OMPI_COMM_WORLD_SIZE")) {
    thread_ = std::thread([this] { Run(); });
  }
  ~MpiCluster() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // MPI_Finalize, on the thread that initialized MPI
  }

  // From the launcher's environment when it says (what MPI says is checked
  // against it once MPI has started: Started), else once MPI has started.
  int rank() const override {
    if (env_rank_ >= 0 && env_size_ > 0) return env_rank_;
    (void)Started();
    return rank_;
  }
  int size() const override {
    if (env_rank_ >= 0 && env_size_ > 0) return env_size_;
    (void)Started();
    return size_;
  }

  absl::Status Broadcast(std::string* bytes, int root) override {
    return Call([&]() -> absl::Status {
      int64_t n = static_cast<int64_t>(bytes->size());
      MPI_Request req;
      int rc = mpi->Ibcast(&n, 1, mpi->int64, root, mpi->comm_world, &req);
      if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
      if (rc != MPI_SUCCESS) return MpiError(rc, "Bcast");
      bytes->resize(static_cast<size_t>(n));
      for (int64_t off = 0; off < n; off += kMaxPiece) {
        const int piece = static_cast<int>(std::min(kMaxPiece, n - off));
        rc = mpi->Ibcast(bytes->data() + off, piece, mpi->byte, root, mpi->comm_world, &req);
        if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
        if (rc != MPI_SUCCESS) return MpiError(rc, "Bcast");
      }
      return absl::OkStatus();
    });
  }

  absl::StatusOr<std::vector<std::string>> Gather(const std::string& mine, int root) override {
    std::vector<std::string> out;
    absl::Status s = Call([&]() -> absl::Status {
      const int64_t n = static_cast<int64_t>(mine.size());
      std::vector<int64_t> sizes(rank_ == root ? size_ : 0);
      MPI_Request req;
      int rc = mpi->Igather(&n, 1, mpi->int64, sizes.data(), 1, mpi->int64, root, mpi->comm_world, &req);
      if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
      if (rc != MPI_SUCCESS) return MpiError(rc, "Gather");
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
            rc = mpi->Irecv(out[r].data() + off, piece, mpi->byte, r, /*tag=*/7, mpi->comm_world, &req);
            if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
            if (rc != MPI_SUCCESS) return MpiError(rc, "Recv");
          }
        }
      } else {
        for (int64_t off = 0; off < n; off += kMaxPiece) {
          const int piece = static_cast<int>(std::min(kMaxPiece, n - off));
          rc = mpi->Isend(mine.data() + off, piece, mpi->byte, root, /*tag=*/7, mpi->comm_world, &req);
          if (rc == MPI_SUCCESS) rc = PoliteWait(&req);
          if (rc != MPI_SUCCESS) return MpiError(rc, "Send");
        }
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return out;
  }

  void Abort(int code) override {
    (void)Call([&]() -> absl::Status {
      mpi->Abort(mpi->comm_world, code);
      return absl::OkStatus();
    });
  }

 private:
  // Runs `f` on the MPI thread once MPI has started (its error otherwise),
  // counting the caller's --timings phases there.
  absl::Status Call(const std::function<absl::Status()>& f) {
    UCP_RETURN_IF_ERROR(Started());
    std::lock_guard<std::mutex> one_at_a_time(call_mu_);
    PhaseTimes* const times = PhaseTimes::Current();
    absl::Status result;
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = [&] {
        PhaseScope bound(times);
        result = f();
      };
      done_ = &done;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done; });
    return result;
  }

  // Waits for MPI_Init_thread on the MPI thread; its error, if it failed.
  absl::Status Started() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_; });
    return start_status_;
  }

  void Run() {
    absl::Status s;
    int provided = 0;
    // Only this thread calls MPI; the command's threads hand it their calls.
    if (int rc = mpi->Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS) {
      s = absl::FailedPreconditionError(absl::StrCat("MPI_Init_thread failed with code ", rc));
    }
    const bool initialized = s.ok();
    if (s.ok()) {
      // PMIx's connection to the launcher, made by MPI_Init: without this,
      // MPI_Finalize waits 40 ms on Nagle's algorithm (loopback_nodelay.h).
      SetNoDelayOnLoopbackTcp();
      mpi->Comm_rank(mpi->comm_world, &rank_);
      mpi->Comm_size(mpi->comm_world, &size_);
      // Errors come back as codes, not as the default abort.
      mpi->Comm_set_errhandler(mpi->comm_world, mpi->errors_return);
      if (env_rank_ >= 0 && env_size_ > 0 && (env_rank_ != rank_ || env_size_ != size_)) {
        s = absl::FailedPreconditionError(absl::StrCat(
            "the launcher's environment says rank ", env_rank_, " of ", env_size_, " (OMPI_COMM_WORLD_RANK, "
            "OMPI_COMM_WORLD_SIZE), MPI says rank ", rank_, " of ", size_));
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    started_ = true;
    start_status_ = s;
    cv_.notify_all();
    while (true) {
      cv_.wait(lock, [&] { return stop_ || task_ != nullptr; });
      if (task_ != nullptr) {
        std::function<void()> task = std::move(task_);
        task_ = nullptr;
        lock.unlock();
        task();
        lock.lock();
        *done_ = true;
        cv_.notify_all();
        continue;
      }
      break;  // stop_, nothing left to run
    }
    lock.unlock();
    if (initialized) mpi->Finalize();
  }

  const int env_rank_, env_size_;
  int rank_ = 0;  // written by the MPI thread before started_
  int size_ = 1;
  std::mutex call_mu_;  // one Call at a time
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool started_ = false;          // guarded by mu_
  absl::Status start_status_;     // guarded by mu_
  std::function<void()> task_;    // guarded by mu_
  bool* done_ = nullptr;          // guarded by mu_
  bool stop_ = false;             // guarded by mu_
  std::thread thread_;
};

}  // namespace

std::string MpiLauncherVariable() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(var) != nullptr) return var;
  }
  return "";
}

bool LaunchedByMpi() { return !MpiLauncherVariable().empty(); }

bool PreferPmixHashDatastore() {
  constexpr char kVariable[] = "PMIX_MCA_gds";
  if (std::getenv(kVariable) != nullptr) return false;  // the user's choice, even empty
  return ::setenv(kVariable, "hash", /*overwrite=*/0) == 0;
}

absl::StatusOr<std::unique_ptr<Cluster>> JoinMpiJobIfLaunched(int* argc, char*** argv) {
  (void)argc;  // Open MPI needs neither (MPI_Init_thread(NULL, NULL, ...))
  (void)argv;
  if (!LaunchedByMpi()) return nullptr;
  (void)PreferPmixHashDatastore();
  if (mpi == nullptr) {
    absl::StatusOr<const OpenMpi*> loaded = LoadOpenMpi();
    if (!loaded.ok()) return loaded.status();
    mpi = *loaded;
  }
  // MPI starts on the cluster's own thread (see MpiCluster): its first
  // collective, or rank() and size() when the launcher's environment does
  // not give them, waits for it and reports its failure.
  return std::unique_ptr<Cluster>(std::make_unique<MpiCluster>());
}

}  // namespace ucp::exec
