// What the two request parsers share (internal to openai_*request.cpp).
#pragma once
#include "serve/openai_fields.h"
#include "serve/openai_request.h"

namespace dsv4::openai::detail {

enum class Endpoint { Chat, Completions };

// The sampling, stopping and streaming fields both endpoints have. Throws fields::FieldError.
GenerationParams parse_generation_params(const fields::json& body, Endpoint endpoint, const RequestLimits& limits);

// A token id below the vocabulary size. Throws fields::FieldError.
int32_t parse_token_id(const fields::json& value, const std::string& path, const RequestLimits& limits);

}  // namespace dsv4::openai::detail
