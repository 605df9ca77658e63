package redisstore

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/runbudget/runbudget/budget"
)

// keyPrefix returns the prefix of every key of the budget called name:
// "rb:{<hex of name>}:". Hex has no braces, so the whole name is the hash
// tag and every key of the budget lands in one Cluster slot; hex is
// injective, so two names never share a key.
func keyPrefix(name string) string {
	return "rb:{" + hex.EncodeToString([]byte(name)) + "}:"
}

// encodeDomain returns the key part of d: "<version>.<hex of ID>". It is
// injective over both fields and cannot contain braces, spaces or colons.
func encodeDomain(d budget.Domain) string {
	var b strings.Builder
	b.Grow(21 + 2*len(d.ID))
	b.WriteString(strconv.Itoa(d.Version))
	b.WriteByte('.')
	b.WriteString(hex.EncodeToString([]byte(d.ID)))
	return b.String()
}

// decodeDomain inverts encodeDomain.
func decodeDomain(enc string) (budget.Domain, error) {
	v, h, ok := strings.Cut(enc, ".")
	if !ok {
		return budget.Domain{}, fmt.Errorf("redisstore: malformed domain key %q", enc)
	}
	ver, err := strconv.Atoi(v)
	if err != nil {
		return budget.Domain{}, fmt.Errorf("redisstore: malformed domain version in %q", enc)
	}
	id, err := hex.DecodeString(h)
	if err != nil {
		return budget.Domain{}, fmt.Errorf("redisstore: malformed domain ID in %q", enc)
	}
	return budget.Domain{Version: ver, ID: string(id)}, nil
}

func sortDomains(ds []budget.DomainUsage) {
	slices.SortFunc(ds, func(a, b budget.DomainUsage) int {
		if c := cmp.Compare(a.Domain.Version, b.Domain.Version); c != 0 {
			return c
		}
		return strings.Compare(a.Domain.ID, b.Domain.ID)
	})
}
