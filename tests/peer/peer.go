// Package peer pins franz-go for the peer suite (tests/peer_suite.rs), which
// runs `go test github.com/twmb/franz-go/pkg/kgo` from this module against
// real brokers, direct and through the proxy. Nothing here is built into the
// proxy; the import only keeps franz-go in go.mod and go.sum.
package peer

import _ "github.com/twmb/franz-go/pkg/kgo"
