// Package llm is the code of docs/llm.md: an asynq handler for OpenAI's
// chat completions and one for Anthropic's messages, each throttled in
// requests and tokens by one key, estimated when enqueued (throttle.Uses)
// and settled from the response's usage (throttle.Used). Its test runs both
// against fake providers that meter requests and tokens strictly.
package llm
