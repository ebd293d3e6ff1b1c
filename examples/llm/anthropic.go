package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/hibiken/asynq"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Anthropic's limits for one model, as the console states them (check
// yours): requests, input tokens and output tokens per minute, each a
// token bucket refilled continuously.
func SetAnthropicLimits(ctx context.Context, lim *throttle.Limiter, key string) error {
	return lim.SetLimits(ctx, key,
		throttle.PerMinute(50),                       // requests per minute
		throttle.PerMinute(30000).In("input-tokens"), // input tokens per minute
		throttle.PerMinute(8000).In("output-tokens")) // output tokens per minute
}

// NewAnthropicTask books its input tokens (counted by the producer, with
// the count_tokens endpoint) and its max_tokens as output tokens.
func NewAnthropicTask(key string, s Summarize) (*asynq.Task, error) {
	payload, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return throttle.NewTask("llm:summarize", payload, throttle.Key(key),
		throttle.Uses("input-tokens", s.PromptTokens),
		throttle.Uses("output-tokens", s.MaxTokens))
}

// AnthropicHandler calls the messages API at base (https://api.anthropic.com)
// and settles both units from the response's usage.
func AnthropicHandler(base, apiKey string) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		var s Summarize
		if err := json.Unmarshal(t.Payload(), &s); err != nil {
			return fmt.Errorf("payload: %v: %w", err, asynq.SkipRetry)
		}
		body, _ := json.Marshal(map[string]any{
			"model":      "claude-sonnet-4-5",
			"max_tokens": s.MaxTokens,
			"messages":   []map[string]string{{"role": "user", "content": "Summarize: " + s.Text}},
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("x-api-key", apiKey)
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		// Learns each unit's limit and what is left from the
		// anthropic-ratelimit-* headers; a 429 suspends the key fleet-wide;
		// a spend limit reached is told apart from a rate limit.
		if err := throttle.Observe(ctx, resp); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("anthropic: %s", resp.Status)
		}
		var out struct {
			Usage struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return err
		}
		if err := throttle.Used(ctx, "input-tokens", out.Usage.InputTokens); err != nil {
			return err
		}
		return throttle.Used(ctx, "output-tokens", out.Usage.OutputTokens)
	}
}
