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

// OpenAI's limits for one model, as its dashboard states them (check
// yours): requests and tokens per minute. The tokens tier counts what a
// request's prompt and max_tokens may use; Observe lowers both to what the
// API's headers say, with the burst its bucket holds.
func SetOpenAILimits(ctx context.Context, lim *throttle.Limiter, key string) error {
	return lim.SetLimits(ctx, key,
		throttle.PerMinute(500),                // requests per minute
		throttle.PerMinute(30000).In("tokens"), // tokens per minute
		throttle.InFlight(16))                  // calls under way at once
}

// Summarize is the payload of an "llm:summarize" task.
type Summarize struct {
	Text         string `json:"text"`
	PromptTokens int    `json:"prompt_tokens"` // counted by the producer (tiktoken)
	MaxTokens    int    `json:"max_tokens"`
}

// NewOpenAITask books the estimate a request may use: its prompt and its
// max_tokens. One request besides, as every task.
func NewOpenAITask(key string, s Summarize) (*asynq.Task, error) {
	payload, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return throttle.NewTask("llm:summarize", payload, throttle.Key(key),
		throttle.Uses("tokens", s.PromptTokens+s.MaxTokens))
}

// OpenAIHandler calls the chat completions API at base (https://api.openai.com)
// and settles the tokens the response says it used.
func OpenAIHandler(base, apiKey string) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		var s Summarize
		if err := json.Unmarshal(t.Payload(), &s); err != nil {
			return fmt.Errorf("payload: %v: %w", err, asynq.SkipRetry)
		}
		body, _ := json.Marshal(map[string]any{
			"model":      "gpt-4o",
			"max_tokens": s.MaxTokens,
			"messages":   []map[string]string{{"role": "user", "content": "Summarize: " + s.Text}},
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		// Learns the limits and the tokens left from the headers; a 429
		// suspends the key fleet-wide (the task comes back later), a spend
		// cap too, under its own log line.
		if err := throttle.Observe(ctx, resp); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("openai: %s", resp.Status)
		}
		var out struct {
			Usage struct {
				TotalTokens int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return err
		}
		// The estimate was prompt + max_tokens: what was not used goes back.
		return throttle.Used(ctx, "tokens", out.Usage.TotalTokens)
	}
}
