package config

import (
	"fmt"
	"strings"
)

// Role is what a server does with the pool.
type Role string

// The roles a mooncake_store server can take.
const (
	RoleBoth     Role = "both"     // loads and saves
	RoleProducer Role = "producer" // saves only
	RoleConsumer Role = "consumer" // loads only
	RoleCapacity Role = "capacity" // lends its segment and moves no KV
)

// ParseRole reads a role as TensorRT-LLM does: surrounding space is dropped and case ignored.
func ParseRole(s string) (Role, error) {
	r := Role(strings.ToLower(strings.TrimSpace(s)))
	switch r {
	case RoleBoth, RoleProducer, RoleConsumer, RoleCapacity:
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q: want both, producer, consumer or capacity", s)
}

// Loads reports whether the role reads pages from the pool.
func (r Role) Loads() bool { return r == RoleBoth || r == RoleConsumer }

// Saves reports whether the role writes pages to the pool.
func (r Role) Saves() bool { return r == RoleBoth || r == RoleProducer }

// Transfers reports whether the role moves KV at all; a capacity role does not.
func (r Role) Transfers() bool { return r.Loads() || r.Saves() }

// Directions counts the transfer directions, each of which pins one staging buffer.
func (r Role) Directions() int {
	n := 0
	if r.Loads() {
		n++
	}
	if r.Saves() {
		n++
	}
	return n
}

// roleField reads a role-valued string field.
func (o *obj) role(key string, dst **Role) {
	var s string
	if !o.str(key, &s, false) {
		return
	}
	r, err := ParseRole(s)
	if err != nil {
		o.errAt(o.field(key), key, err.Error(), "")
		return
	}
	*dst = &r
}
