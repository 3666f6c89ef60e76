// ucp._core: the Python extension module (pybind11) over ucp's C++ library.
// python/ucp/__init__.py is the public API; this module is its engine:
//
//   run(command, flags, progress, interval) -> dict  convert / reshard / export, with the CLI's own flag parsing
//                                                    (cli/command_flags.h), the GIL released while working
//   flag_names(command), usage(command)              the flags (for keyword checks and docstrings)
//   inspect(path) -> dict                            ops::Inspect's InspectReport, field by field
//   open(path, flags) -> Checkpoint                  ops::OpenSource (any format the registry knows)
//   Checkpoint.load(name, state, dtype, copy)        a numpy array, a zero-copy view of the memory-mapped
//                                                    file where the tensor is one contiguous run
//
// A failed absl::Status becomes the ucp.Error subclass of its code
// (python/ucp/_errors.py), carrying the code and the message. Nothing here
// unpickles anything: the files are read by ucp's own pickle and zip readers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "state/model_state.h"
#include "format/torch/dtype.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "ops/convert.h"
#include "ops/export.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "proto/ucp.pb.h"
#include "ops/inspect.h"
#include "cli/command_flags.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "tp/tensor_plan.h"

namespace py = pybind11;

namespace ucp::python {
namespace {

// ---- errors ----

// A failed status on its way to Python (translated in PYBIND11_MODULE).
struct StatusError : std::exception {
  explicit StatusError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "ucp status error"; }
  absl::Status status;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T Take(absl::StatusOr<T> s) {
  if (!s.ok()) throw StatusError(s.status());
  return *std::move(s);
}

// ---- protobuf -> dict ----

py::object Scalar(const google::protobuf::Message& m, const google::protobuf::FieldDescriptor* f, int index);

// Every field of `m` under its proto name: scalars (defaults included),
// enums by name, repeated fields as lists, unset messages as None.
py::dict ProtoToDict(const google::protobuf::Message& m) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  py::dict out;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      py::list l;
      for (int j = 0; j < r->FieldSize(m, f); ++j) l.append(Scalar(m, f, j));
      out[py::str(f->name())] = l;
    } else if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE && !r->HasField(m, f)) {
      out[py::str(f->name())] = py::none();
    } else {
      out[py::str(f->name())] = Scalar(m, f, -1);
    }
  }
  return out;
}

// Field `f` of `m` (element `index` of a repeated field, or -1).
py::object Scalar(const google::protobuf::Message& m, const google::protobuf::FieldDescriptor* f, int index) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return py::int_(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case FD::CPPTYPE_INT64:
      return py::int_(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FD::CPPTYPE_UINT32:
      return py::int_(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
    case FD::CPPTYPE_UINT64:
      return py::int_(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case FD::CPPTYPE_DOUBLE:
      return py::float_(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case FD::CPPTYPE_FLOAT:
      return py::float_(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FD::CPPTYPE_BOOL:
      return py::bool_(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
    case FD::CPPTYPE_ENUM:
      return py::str((rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name());
    case FD::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      if (f->type() == FD::TYPE_BYTES) return py::bytes(s);
      return py::str(s);
    }
    case FD::CPPTYPE_MESSAGE:
      return ProtoToDict(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return py::none();
}

py::dict TopologyDict(const state::Topology& t) {
  py::dict d;
  d["tp"] = t.tp;
  d["pp"] = t.pp;
  d["dp"] = t.dp;
  return d;
}

// ---- flags ----

// `flags` (as `--name=value` strings) parsed by the command's FlagSet;
// kInvalidArgument for unknown flags, bad values, missing required ones and
// positional arguments.
void ParseFlags(cli::FlagSet& f, const std::string& command, const std::vector<std::string>& flags) {
  std::vector<std::string> args = {command};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto positional = Take(f.Parse(static_cast<int>(argv.size()), argv.data()));
  if (!positional.empty()) {
    Check(absl::InvalidArgumentError(
        absl::StrCat("ucp ", command, ": unexpected argument '", positional.front(), "' (flags are --name=value)")));
  }
}

// The flags `ucp.open` takes: how a ZeRO source's tp merges are decided.
struct OpenFlags {
  cli::ZeroSourceFlags src;
  int threads = 0;
  int64_t divisible_by = 0;
  bool verify_checksums = false;

  void Register(cli::FlagSet& f) {
    src.Register(f);
    f.Int32("num_threads", &threads, "threads reading the evidence of a ZeRO source (0 = all cores)");
    f.Int("make_vocab_size_divisible_by", &divisible_by,
          "vocabulary padding multiple per tp rank (0 = from the checkpoint's args)");
    f.Bool("verify_checksums", &verify_checksums, "check a ucp universal folder against its manifest first");
  }
};

// The flags' names and --help text of a command (for flag_names(), usage()).
std::pair<std::vector<std::string>, std::string> DescribeFlags(const std::string& command) {
  cli::FlagSet f(command, "");
  cli::ConvertFlags c;
  cli::ReshardFlags r;
  cli::ExportFlags e;
  OpenFlags o;
  if (command == "convert") {
    c.Register(f);
  } else if (command == "reshard") {
    r.Register(f);
  } else if (command == "export") {
    e.Register(f);
  } else if (command == "open") {
    o.Register(f);
  } else {
    Check(absl::InvalidArgumentError(
        absl::StrCat("unknown command '", command, "': expected convert, reshard, export or open")));
  }
  return {f.Names(), f.Usage()};
}

// ---- progress ----

// Delivers progress events to a Python callable as dicts with the fields of
// `--progress=json` lines: the first event of each phase, its last one
// (units_done >= units_total), and the others at most every `interval`
// seconds. Events come from worker threads: each call takes the GIL. The
// first exception the callable raises stops further calls and is re-raised
// by Rethrow() when the operation has returned (it does not interrupt it).
class PyProgress {
 public:
  PyProgress(std::string command, py::object callback, double interval)
      : command_(std::move(command)),
        callback_(std::move(callback)),
        interval_(std::chrono::duration<double>(interval)),
        start_(std::chrono::steady_clock::now()) {}

  ProgressFn Callback() {
    if (callback_.is_none()) return nullptr;
    return [this](const ProgressEvent& e) { Report(e); };
  }

  void Rethrow() {
    if (error_) {
      py::error_already_set e = *error_;
      error_.reset();
      throw e;
    }
    if (!other_error_.empty()) throw std::runtime_error("progress callback: " + other_error_);
  }

 private:
  void Report(const ProgressEvent& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool new_phase = !have_phase_ || e.phase != phase_;
    const bool done = e.units_done >= e.units_total;
    if (!new_phase && !done && now - last_ < interval_) return;
    have_phase_ = true;
    phase_ = e.phase;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const cli::ProgressFigures fig = cli::FiguresOf(e, elapsed);
    py::gil_scoped_acquire gil;
    try {
      py::dict d;
      d["command"] = command_;
      d["phase"] = e.phase;
      d["bytes_done"] = e.bytes_done;
      d["bytes_total"] = e.bytes_total;
      d["units_done"] = e.units_done;
      d["units_total"] = e.units_total;
      d["elapsed_s"] = fig.elapsed_s;
      d["mb_per_s"] = fig.mb_per_s;
      d["eta_s"] = fig.eta_s;
      callback_(d);
    } catch (py::error_already_set& err) {
      failed_ = true;
      error_.emplace(err);
    } catch (const std::exception& err) {  // never into the worker thread's code
      failed_ = true;
      other_error_ = err.what();
    }
  }

  std::string command_;
  py::object callback_;
  std::chrono::duration<double> interval_;
  std::chrono::steady_clock::time_point start_, last_;
  std::mutex mu_;
  bool have_phase_ = false;
  std::string phase_;
  bool failed_ = false;
  std::optional<py::error_already_set> error_;
  std::string other_error_;
};

ProgressFn Both(ProgressFn a, ProgressFn b) {
  if (!a) return b;
  if (!b) return a;
  return [a, b](const ProgressEvent& e) {
    a(e);
    b(e);
  };
}

// ---- convert / reshard / export ----

py::dict Run(const std::string& command, const std::vector<std::string>& flags, py::object progress, double interval) {
  cli::FlagSet f(command, "");
  py::dict out;
  out["command"] = command;
  if (command == "convert") {
    cli::ConvertFlags c;
    c.Register(f);
    ParseFlags(f, command, flags);
    Check(c.Finish());
    cli::ProgressPrinter printer(command, Take(cli::ParseProgressMode(c.progress)));
    PyProgress py_progress(command, progress, interval);
    c.options.write.progress = Both(printer.Callback(), py_progress.Callback());
    absl::StatusOr<ops::ConvertResult> result;
    {
      py::gil_scoped_release release;
      result = ops::Convert(c.options);
    }
    py_progress.Rethrow();
    Check(result.status());
    const bool dry = c.options.dry_run_ranks > 0;
    out["output_folder"] = c.options.output_folder;
    out["dry_run"] = dry;
    out["plan"] = result->plan;
    out["params"] = result->stats.params;
    out["files"] = result->stats.files;
    out["bytes"] = result->stats.bytes;
    out["rules_summary"] = result->summary;
    out["explain"] = result->explain;
    out["notes"] = result->warnings;
    out["report"] = dry ? result->plan : cli::ConvertReport(c, *result);
  } else if (command == "reshard") {
    cli::ReshardFlags r;
    r.Register(f);
    ParseFlags(f, command, flags);
    Check(r.Finish());
    cli::ProgressPrinter printer(command, Take(cli::ParseProgressMode(r.progress)));
    PyProgress py_progress(command, progress, interval);
    r.options.write.progress = Both(printer.Callback(), py_progress.Callback());
    absl::StatusOr<ops::ReshardResult> result;
    {
      py::gil_scoped_release release;
      result = ops::Reshard(r.options);
    }
    py_progress.Rethrow();
    Check(result.status());
    const bool dry = r.options.dry_run_ranks > 0;
    out["output_folder"] = r.options.output_folder;
    out["dry_run"] = dry;
    out["plan"] = result->plan;
    out["files"] = result->write.files;
    out["bytes"] = result->write.bytes;
    out["source_kind"] = result->source_kind;
    out["source_topology"] = TopologyDict(result->source);
    out["target_topology"] = TopologyDict(r.options.write.target);
    out["zero_stage"] = result->write.layout.zero_stage;
    out["partition_method"] = result->write.layout.partition_method;
    out["stage_boundaries"] = result->write.layout.parts;
    out["notes"] = result->notes;
    out["report"] = dry ? result->plan : cli::ReshardReport(r, *result);
  } else if (command == "export") {
    cli::ExportFlags e;
    e.Register(f);
    ParseFlags(f, command, flags);
    Check(e.Finish());
    cli::ProgressPrinter printer(command, Take(cli::ParseProgressMode(e.progress)));
    PyProgress py_progress(command, progress, interval);
    e.options.write.progress = Both(printer.Callback(), py_progress.Callback());
    absl::StatusOr<ops::ExportResult> result;
    {
      py::gil_scoped_release release;
      result = ops::Export(e.options);
    }
    py_progress.Rethrow();
    Check(result.status());
    out["output_folder"] = e.options.output_folder;
    out["dry_run"] = false;
    out["tensors"] = result->stats.params;
    out["files"] = result->stats.files;
    out["bytes"] = result->stats.bytes;
    out["architecture"] = result->architecture;
    out["notes"] = result->notes;
    out["report"] = cli::ExportReport(e, *result);
  } else {
    Check(absl::InvalidArgumentError(
        absl::StrCat("unknown command '", command, "': expected convert, reshard or export")));
  }
  return out;
}

// ---- inspect ----

py::dict InspectPath(const std::string& path) {
  absl::StatusOr<InspectReport> report;
  {
    py::gil_scoped_release release;
    report = ops::Inspect(path);
  }
  Check(report.status());
  return ProtoToDict(*report);
}

// ---- open / load ----

// numpy has no bfloat16: its values come as int16 holding the bits
// (torch.from_numpy(a).view(torch.bfloat16) gives the tensor).
py::dtype NumpyDType(torch::DType t) {
  switch (t) {
    case torch::DType::kFloat32:
      return py::dtype("<f4");
    case torch::DType::kFloat64:
      return py::dtype("<f8");
    case torch::DType::kFloat16:
      return py::dtype("<f2");
    case torch::DType::kBFloat16:
    case torch::DType::kInt16:
      return py::dtype("<i2");
    case torch::DType::kInt8:
      return py::dtype("i1");
    case torch::DType::kInt32:
      return py::dtype("<i4");
    case torch::DType::kInt64:
      return py::dtype("<i8");
    case torch::DType::kUInt8:
      return py::dtype("u1");
    case torch::DType::kBool:
      return py::dtype("?");
    case torch::DType::kComplex64:
      return py::dtype("<c8");
    case torch::DType::kComplex128:
      return py::dtype("<c16");
  }
  throw StatusError(absl::InternalError("unknown dtype"));
}

std::vector<py::ssize_t> RowMajorStrides(const std::vector<int64_t>& shape, size_t itemsize) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t s = static_cast<py::ssize_t>(itemsize);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= static_cast<py::ssize_t>(std::max<int64_t>(shape[i], 1));
  }
  return strides;
}

// A numpy array over `t`'s memory (contiguous), keeping `t` (and so its
// storage and the file mapping behind it) alive as the array's base.
// Read-only unless `writeable` (memory the process owns, e.g. a cast).
py::array ViewArray(const torch::Tensor& t, bool writeable) {
  auto* keep = new torch::Tensor(t);
  py::capsule base(keep, [](void* p) { delete static_cast<torch::Tensor*>(p); });
  std::vector<py::ssize_t> shape(t.sizes().begin(), t.sizes().end());
  py::array a(NumpyDType(t.dtype()), shape, RowMajorStrides(t.sizes(), torch::ItemSize(t.dtype())), t.data(), base);
  if (!writeable) a.attr("setflags")(py::arg("write") = false);
  return a;
}

class Checkpoint {
 public:
  Checkpoint(std::string path, std::string kind, std::shared_ptr<const state::ModelState> state)
      : path_(std::move(path)), kind_(std::move(kind)), state_(std::move(state)) {}

  const std::string& path() const { return path_; }
  const std::string& kind() const { return kind_; }

  py::dict Info() const {
    const state::ModelInfo& info = state_->info();
    py::dict d;
    d["path"] = path_;
    d["kind"] = kind_;
    d["source_topology"] = TopologyDict(info.source_topology);
    d["zero_stage"] = info.zero_stage;
    d["optimizer"] = state::OptimizerKindName(info.optimizer_kind);
    d["lp_dtype"] = std::string(torch::DTypeName(info.lp_dtype));
    d["num_groups"] = info.num_groups;
    d["state_keys"] = info.state_keys;
    d["scalar_keys"] = info.scalar_keys;
    d["pipeline"] = info.pipeline;
    d["num_layers"] = info.num_layers;
    d["original_vocab_size"] = info.original_vocab_size;
    d["notes"] = info.notes;
    return d;
  }

  py::list Params() const {
    py::list out;
    for (const state::ParamState& p : state_->info().params) {
      py::dict d;
      d["name"] = p.name;
      d["shape"] = py::tuple(py::cast(p.full_shape));
      d["dtype"] = std::string(torch::DTypeName(p.lp_dtype));
      d["kind"] = MergeKind_Name(p.rule.kind());
      d["source"] = RuleSource_Name(p.source);
      d["origin"] = p.origin;
      d["rule"] = ProtoToDict(p.rule);
      d["group"] = p.group;
      d["role"] = state::TensorRoleName(p.role);
      d["layer"] = p.layer;
      d["tied_key"] = p.tied_key;
      out.append(d);
    }
    return out;
  }

  // (array, torch dtype name of its values).
  py::tuple Load(const std::string& name, const std::string& state, const std::string& dtype, bool copy) const {
    const state::ModelInfo& info = state_->info();
    const state::ParamState* p = info.Find(name);
    if (p == nullptr) {
      Check(absl::NotFoundError(absl::StrCat(path_, ": no param '", name, "'")));
    }
    std::vector<std::string> states = {state::kFp32State};
    states.insert(states.end(), info.state_keys.begin(), info.state_keys.end());
    states.push_back(state::kLpState);
    if (std::find(states.begin(), states.end(), state) == states.end()) {
      Check(absl::InvalidArgumentError(absl::StrCat(path_, ": param '", name, "': no state '", state,
                                                    "' (expected one of ", absl::StrJoin(states, ", "), ")")));
    }
    std::optional<torch::DType> cast;
    if (!dtype.empty()) cast = Take(torch::ParseDType(dtype));
    absl::StatusOr<tp::TensorPlan> plan;
    {
      py::gil_scoped_release release;
      plan = state_->Full(*p, state);
    }
    if (!plan.ok() && !absl::StrContains(plan.status().message(), path_)) {
      Check(absl::Status(plan.status().code(), absl::StrCat(path_, ": ", plan.status().message())));
    }
    Check(plan.status());
    if (cast && *cast != plan->dtype()) {
      absl::StatusOr<torch::Tensor> t;
      {
        py::gil_scoped_release release;
        t = plan->Materialize();
        if (t.ok()) t = torch::Cast(*t, *cast);
      }
      return py::make_tuple(ViewArray(Take(std::move(t)), /*writeable=*/true), std::string(torch::DTypeName(*cast)));
    }
    const std::string dtype_name(torch::DTypeName(plan->dtype()));
    std::vector<py::ssize_t> shape(plan->shape().begin(), plan->shape().end());
    const auto strides = RowMajorStrides(plan->shape(), torch::ItemSize(plan->dtype()));
    py::array out(NumpyDType(plan->dtype()), shape, strides);
    uint8_t* scratch = static_cast<uint8_t*>(out.mutable_data());
    if (!copy && plan->num_runs() == 1) {
      // One run: ViewFlat returns the source's own memory when the source is
      // contiguous (else it copies into `out`). The array's base is a copy of
      // the plan, which holds the source tensors, their storages and the
      // file mapping behind them.
      auto* keep = new tp::TensorPlan(*plan);
      py::capsule base(keep, [](void* p) { delete static_cast<tp::TensorPlan*>(p); });
      absl::StatusOr<absl::Span<const uint8_t>> bytes;
      {
        py::gil_scoped_release release;
        bytes = keep->ViewFlat(0, keep->numel(), scratch);
      }
      Check(bytes.status());
      if (bytes->data() != scratch) {
        py::array view(NumpyDType(plan->dtype()), shape, strides, bytes->data(), base);
        view.attr("setflags")(py::arg("write") = false);
        return py::make_tuple(view, dtype_name);
      }
      return py::make_tuple(out, dtype_name);
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = plan->CopyFlat(0, plan->numel(), scratch);
    }
    Check(s);
    return py::make_tuple(out, dtype_name);
  }

 private:
  std::string path_, kind_;
  std::shared_ptr<const state::ModelState> state_;
};

std::unique_ptr<Checkpoint> Open(const std::string& path, const std::vector<std::string>& flags) {
  cli::FlagSet f("open", "");
  OpenFlags o;
  o.Register(f);
  ParseFlags(f, "open", flags);
  ops::SourceOptions options = Take(o.src.Options(o.threads, o.divisible_by));
  absl::StatusOr<ops::OpenedSource> opened;
  {
    py::gil_scoped_release release;
    options.verify_checksums = o.verify_checksums;
    opened = ops::OpenSource(path, options, nullptr);
  }
  Check(opened.status());
  return std::make_unique<Checkpoint>(path, std::string(opened->format->kind()),
                                      std::shared_ptr<const state::ModelState>(std::move(opened->state)));
}

}  // namespace
}  // namespace ucp::python

PYBIND11_MODULE(_core, m) {
  using namespace ucp::python;
  m.doc() = "ucp's C++ engine; use the `ucp` package.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object errors = py::module_::import("ucp._errors");
      py::object exc = errors.attr("from_status")(static_cast<int>(e.status.code()),
                                                  absl::StatusCodeToString(e.status.code()),
                                                  std::string(e.status.message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  m.def("run", &Run, py::arg("command"), py::arg("flags"), py::arg("progress") = py::none(),
        py::arg("interval") = 0.1,
        "Runs `ucp COMMAND FLAGS...` (convert, reshard, export) in this process; returns its summary as a dict.");
  m.def(
      "flag_names", [](const std::string& command) { return DescribeFlags(command).first; }, py::arg("command"));
  m.def(
      "usage", [](const std::string& command) { return DescribeFlags(command).second; }, py::arg("command"));
  m.def("inspect", &InspectPath, py::arg("path"));
  m.def("open", &Open, py::arg("path"), py::arg("flags"));

  py::class_<Checkpoint>(m, "Checkpoint")
      .def_property_readonly("path", &Checkpoint::path)
      .def_property_readonly("kind", &Checkpoint::kind)
      .def("info", &Checkpoint::Info)
      .def("params", &Checkpoint::Params)
      .def("load", &Checkpoint::Load, py::arg("name"), py::arg("state") = "fp32", py::arg("dtype") = "",
           py::arg("copy") = false);
}
