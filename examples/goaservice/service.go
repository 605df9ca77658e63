package main

import (
	"context"
	"errors"
	"sync"

	"github.com/runbudget/runbudget/examples/goaservice/gen/objects"
)

// store implements the generated objects.Service: objects held in memory,
// free of any admission concern (that is installed around its endpoints).
type store struct {
	mu      sync.Mutex
	objects map[string]string
}

var _ objects.Service = (*store)(nil)

func newStore() *store { return &store{objects: make(map[string]string)} }

// Put stores p.Content under p.Key, replacing what was there.
func (s *store) Put(_ context.Context, p *objects.PutPayload) (*objects.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objects[p.Key] = p.Content
	return &objects.Object{Key: p.Key, Size: int64(len(p.Content))}, nil
}

// Copy copies the object at p.Key to p.To, or returns the design's not_found
// error when there is none.
func (s *store) Copy(_ context.Context, p *objects.CopyPayload) (*objects.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	content, ok := s.objects[p.Key]
	if !ok {
		return nil, objects.MakeNotFound(errors.New("no object has that key"))
	}
	s.objects[p.To] = content
	return &objects.Object{Key: p.To, Size: int64(len(content))}, nil
}
