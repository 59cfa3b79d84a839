package sandbox

import (
	"encoding/json"
	"fmt"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

func unmarshalEvent(p []byte, ev *agentproto.Event) error {
	if err := json.Unmarshal(p, ev); err != nil {
		return fmt.Errorf("%w: %v", agentproto.ErrBadFrame, err)
	}
	return nil
}
