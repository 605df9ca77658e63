module github.com/runbudget/runbudget/examples/goaservice

go 1.26.0

replace github.com/runbudget/runbudget => ../..

require (
	github.com/redis/go-redis/v9 v9.23.0
	github.com/runbudget/runbudget v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	goa.design/goa/v3 v3.25.3
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dimfeld/httppath v0.0.0-20170720192232-ee938bf73598 // indirect
	github.com/go-chi/chi/v5 v5.2.4 // indirect
	github.com/gohugoio/hashstructure v0.6.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/gorilla/websocket v1.5.3 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/manveru/faker v0.0.0-20171103152722-9fbc68a78c4d // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/mod v0.32.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	golang.org/x/tools v0.41.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)

tool goa.design/goa/v3/cmd/goa
