// plan_impl.hpp: the concrete Plan: its steps, loaded kernels and workspace layout.
#pragma once
#include <memory>
#include <vector>

#include "backend.hpp"
#include "planner.hpp"
#include "smla/smla.hpp"
#include "workspace.hpp"

namespace smla {

class PlanImpl : public Plan {
 public:
  const Problem& problem() const override { return problem_; }
  size_t workspace_bytes() const override { return layout_.total; }
  void run(const Tensors& t, void* workspace, size_t workspace_size, void* stream) const override;
  std::optional<BadIndex> index_report(const void* workspace, void* stream) const override;
  const PlanInfo& info() const override { return info_; }
  size_t launch_count() const override { return steps_.size(); }
  void run_launch(size_t i, const Tensors& t, void* workspace, size_t workspace_size, void* stream) const override;
  std::string launch_phase(size_t i) const override;

  /// Validates the tensors and workspace (throws naming the argument) and fills the params
  /// common to every step.
  SmlaParams base_params(const Tensors& t, void* workspace, size_t workspace_size) const;
  /// Throws NoBackend when the plan's backend cannot run now (a plan made before a fork(), used in the child), before
  /// any driver call: run() and index_report() ask it first.
  void require_usable_backend() const;
  /// Step i's params: its chunk, pass, and for a token chunk its tokens' offsets.
  SmlaParams step_params(size_t i, const SmlaParams& base) const;
  void launch_step(size_t i, const SmlaParams& base, void* stream) const;
  /// Every step in order, csr on a side stream where the backend has one.
  void run_steps(const SmlaParams& base, void* stream) const;
  /// Runs `launches`; a driver error it throws becomes InvalidArgument naming the stream where the backend finds
  /// `stream` foreign (any other error passes unchanged).
  template <class Launches>
  void naming_a_foreign_stream(void* stream, Launches&& launches) const;

  Problem problem_;
  std::shared_ptr<const void> owner_;  // the Runtime's state that backend_ points into: a plan may outlive its Runtime
  Backend* backend_ = nullptr;
  ShapeInfo shape_;
  WorkspaceLayout layout_;
  std::vector<Step> steps_;
  std::vector<std::shared_ptr<LoadedKernel>> kernels_;
  PlanInfo info_;
};

}  // namespace smla
