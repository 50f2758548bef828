// Declarations every bigbatch options and state type repeats, written once.
// Internal to optimizers/: included by the four optimizer headers.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

// The members an XOptions struct declares besides its TORCH_ARG fields.
#define BIGBATCH_OPTIONS_MEMBERS(Name)                                         \
 public:                                                                        \
  void serialize(torch::serialize::InputArchive& archive) override;            \
  void serialize(torch::serialize::OutputArchive& archive) const override;     \
  double get_lr() const override { return lr(); }                              \
  void set_lr(const double new_lr) override { lr(new_lr); }                    \
  /** Throws c10::Error naming the first invalid option and its value. */      \
  void validate() const;                                                       \
  friend bool operator==(const Name& lhs, const Name& rhs);                    \
  ~Name() override = default

// The members an XParamState struct declares besides its TORCH_ARG fields.
#define BIGBATCH_PARAM_STATE_MEMBERS(Name)                                     \
 public:                                                                        \
  /** Zeroed fp32 state for `param`, made on its first step. */                \
  static Name fresh(const at::Tensor& param);                                  \
  void serialize(torch::serialize::InputArchive& archive) override;            \
  void serialize(torch::serialize::OutputArchive& archive) const override;     \
  friend bool operator==(const Name& lhs, const Name& rhs);                    \
  ~Name() override = default
