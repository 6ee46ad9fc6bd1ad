//go:build tools

// Package tools records the kwok command hack/testenv builds.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
