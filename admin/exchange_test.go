package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/message"
	"github.com/delaybridge/delaybridge/storage"
	"github.com/delaybridge/delaybridge/wire"
)

// rowsStore answers List and Get from rows, whatever the filter but an ID
// (show lists an id's sends), and records the filters List was given; everything else goes to the wrapped
// store. It holds exchange rows whatever the wrapped store persists.
type rowsStore struct {
	storage.Store
	rows []storage.Timeout

	mu      sync.Mutex
	filters []storage.ListFilter
}

func (s *rowsStore) List(_ context.Context, f storage.ListFilter) ([]storage.Timeout, string, error) {
	s.mu.Lock()
	s.filters = append(s.filters, f)
	s.mu.Unlock()
	out := []storage.Timeout{}
	for _, r := range s.rows {
		if f.ID != "" && !wire.IsKeyOf(r.ID, f.ID) {
			continue
		}
		r.Message = nil
		out = append(out, r)
	}
	return out, "", nil
}

func (s *rowsStore) Get(_ context.Context, id string) (storage.Timeout, error) {
	for _, r := range s.rows {
		if r.ID == id {
			return r, nil
		}
	}
	return storage.Timeout{}, storage.ErrNotFound
}

func (s *rowsStore) listed() []storage.ListFilter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]storage.ListFilter(nil), s.filters...)
}

func encoded(t *testing.T, p amqp.Publishing) []byte {
	t.Helper()
	b, err := message.Encode(nil, &p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func keysOf(m map[string]any) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

// A queue row keeps exactly the fields it always had; an exchange row has
// exchange and routing_key (present when empty) and an empty destination,
// in the list and in show.
func TestExchangeRowsInJSON(t *testing.T) {
	rs := &rowsStore{rows: []storage.Timeout{
		{ID: "q", Destination: "orders", DueAt: t0.Add(time.Minute), ReceivedAt: t0},
		{ID: "x", Exchange: "events", Destination: "order.created", DueAt: t0.Add(2 * time.Minute), ReceivedAt: t0,
			Message: encoded(t, amqp.Publishing{Body: []byte("hi")})},
		{ID: "fan", Exchange: "broadcast", DueAt: t0.Add(3 * time.Minute), ReceivedAt: t0},
	}}
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { rs.Store = s; return rs })
	var list struct {
		Timeouts []map[string]any `json:"timeouts"`
	}
	f.want("GET", "/api/v1/timeouts", "", 200, &list)
	if len(list.Timeouts) != 3 {
		t.Fatalf("%d rows, want 3", len(list.Timeouts))
	}
	q, x, fan := list.Timeouts[0], list.Timeouts[1], list.Timeouts[2]
	if got := keysOf(q); got != "attempts,destination,due_at,id,last_error,leased,received_at" || q["destination"] != "orders" {
		t.Errorf("queue row %v: fields %s", q, got)
	}
	for _, tc := range []struct {
		row           map[string]any
		exchange, key string
	}{{x, "events", "order.created"}, {fan, "broadcast", ""}} {
		got := keysOf(tc.row)
		if got != "attempts,destination,due_at,exchange,id,last_error,leased,received_at,routing_key" ||
			tc.row["destination"] != "" || tc.row["exchange"] != tc.exchange || tc.row["routing_key"] != tc.key {
			t.Errorf("exchange row %v: fields %s; want exchange %q, routing_key %q, destination empty", tc.row, got, tc.exchange, tc.key)
		}
	}

	var show map[string]any
	f.want("GET", tpath("x"), "", 200, &show)
	if show["exchange"] != "events" || show["routing_key"] != "order.created" || show["destination"] != "" || show["body_base64"] != "aGk=" {
		t.Errorf("show of an exchange row: %v", show)
	}
	var typed TimeoutJSON
	f.want("GET", tpath("x"), "", 200, &typed)
	if typed.Exchange != "events" || typed.RoutingKey == nil || *typed.RoutingKey != "order.created" || typed.Destination != "" {
		t.Errorf("show decoded: %+v", typed)
	}
}

// The list's destination filters reach the store as storage.ListFilter
// documents them; a wrong combination or a name no destination can have is
// a 400 that says why, and never a store call.
func TestDestinationFilters(t *testing.T) {
	rs := &rowsStore{}
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { rs.Store = s; return rs })
	for query, want := range map[string]storage.ListFilter{
		"":                                    {},
		"destination=orders":                  {Destination: "orders"},
		"exchange=events":                     {Exchange: "events"},
		"exchange=events&routing_key=a.b":     {Exchange: "events", Destination: "a.b"},
		"exchange=amq.topic&routing_key=%23":  {Exchange: "amq.topic", Destination: "#"},
		"destination=&exchange=events":        {Exchange: "events"},
		"exchange=&destination=orders":        {Destination: "orders"},
		"exchange=events&routing_key=order.*": {Exchange: "events", Destination: "order.*"},
	} {
		before := len(rs.listed())
		f.want("GET", "/api/v1/timeouts?"+query, "", http.StatusOK, nil)
		got := rs.listed()
		if len(got) != before+1 {
			t.Fatalf("%q: %d List calls, want 1", query, len(got)-before)
		}
		if g := got[len(got)-1]; g.Destination != want.Destination || g.Exchange != want.Exchange {
			t.Errorf("%q: store got Destination %q Exchange %q, want %q %q", query, g.Destination, g.Exchange, want.Destination, want.Exchange)
		}
	}

	calls := len(rs.listed())
	long := strings.Repeat("x", 256)
	for query, want := range map[string]string{
		"routing_key=a":                        "give exchange too",
		"exchange=&routing_key=a":              "give exchange too",
		"destination=q&routing_key=a":          "give exchange too",
		"destination=q&exchange=events":        "exclude each other",
		"exchange=amq.default":                 "default exchange",
		"exchange=events&routing_key=":         "empty routing key cannot be filtered on",
		"exchange=a%00b":                       "invalid exchange filter: exchange contains control characters",
		"exchange=%FF":                         "invalid exchange filter: exchange is not valid UTF-8",
		"exchange=" + long:                     "invalid exchange filter: exchange is 256 bytes",
		"exchange=e&routing_key=a%0A":          "invalid routing_key filter: routing_key contains control characters",
		"exchange=e&routing_key=%FE":           "invalid routing_key filter: routing_key is not valid UTF-8",
		"exchange=e&routing_key=" + long:       "invalid routing_key filter: routing_key is 256 bytes",
		"destination=%00&exchange=":            "invalid destination filter",
		"destination=" + url.QueryEscape(long): "invalid destination filter",
	} {
		b := f.want("GET", "/api/v1/timeouts?"+query, "", http.StatusBadRequest, nil)
		var e ErrorJSON
		_ = json.Unmarshal(b, &e)
		if !strings.Contains(e.Error, want) {
			t.Errorf("%.60q: error %q, want it to say %q", query, e.Error, want)
		}
	}
	if n := len(rs.listed()) - calls; n != 0 {
		t.Errorf("%d List calls for refused filters", n)
	}
}

// saga_id reaches the store as ListFilter.SagaID, with the other filters;
// an empty or invalid one is a 400 and no store call.
func TestSagaFilter(t *testing.T) {
	rs := &rowsStore{}
	f := newFixtureOver(t, token, func(s storage.Store) storage.Store { rs.Store = s; return rs })
	for query, want := range map[string]storage.ListFilter{
		"saga_id=7d3e":                      {SagaID: "7d3e"},
		"saga_id=a%2Fb&destination=q":       {SagaID: "a/b", Destination: "q"},
		"exchange=events&saga_id=s&limit=5": {SagaID: "s", Exchange: "events"},
	} {
		f.want("GET", "/api/v1/timeouts?"+query, "", http.StatusOK, nil)
		got := rs.listed()
		if g := got[len(got)-1]; g.SagaID != want.SagaID || g.Destination != want.Destination || g.Exchange != want.Exchange {
			t.Errorf("%q: store got %+v, want %+v", query, g, want)
		}
	}
	calls := len(rs.listed())
	for _, query := range []string{"saga_id=", "saga_id=a%00b", "saga_id=%FF"} {
		b := f.want("GET", "/api/v1/timeouts?"+query, "", http.StatusBadRequest, nil)
		if !strings.Contains(string(b), "invalid saga id filter") {
			t.Errorf("%q: %s", query, b)
		}
	}
	if n := len(rs.listed()) - calls; n != 0 {
		t.Errorf("%d List calls for refused saga filters", n)
	}
}

// Over a real store: a queue and a routing key of the same name are told
// apart by every filter, and the item answered by show, reschedule and
// dispatch names the exchange. (Needs a store that persists Exchange.)
func TestExchangeDestinationsOverTheStore(t *testing.T) {
	f := newFixture(t, token)
	for i, r := range []storage.Timeout{
		{ID: "queue", Destination: "order.created"},
		{ID: "x-created", Exchange: "events", Destination: "order.created"},
		{ID: "x-empty", Exchange: "events"},
		{ID: "other-x", Exchange: "audit", Destination: "order.created"},
	} {
		r.DueAt, r.ReceivedAt, r.Message = t0.Add(time.Duration(i+1)*time.Minute), t0, encoded(t, amqp.Publishing{})
		if ins, err := f.store.Insert(context.Background(), []storage.Timeout{r}); err != nil || ins[0] != storage.Stored {
			t.Fatalf("insert %s: %v %v", r.ID, ins, err)
		}
	}
	ids := func(query string) string {
		t.Helper()
		var l ListJSON
		f.want("GET", "/api/v1/timeouts?"+query, "", 200, &l)
		var s []string
		for _, r := range l.Timeouts {
			s = append(s, r.ID)
		}
		return strings.Join(s, ",")
	}
	for query, want := range map[string]string{
		"":                          "queue,x-created,x-empty,other-x",
		"destination=order.created": "queue",
		"exchange=events":           "x-created,x-empty",
		"exchange=events&routing_key=order.created": "x-created",
		"exchange=audit":   "other-x",
		"exchange=nowhere": "",
	} {
		if got := ids(query); got != want {
			t.Errorf("%q: %s, want %s", query, got, want)
		}
	}
	check := func(what string, r TimeoutJSON, exchange, key string) {
		t.Helper()
		if r.Exchange != exchange || r.RoutingKey == nil || *r.RoutingKey != key || r.Destination != "" {
			t.Errorf("%s: destination %q exchange %q routing key %v; want exchange %q routing key %q", what, r.Destination, r.Exchange, r.RoutingKey, exchange, key)
		}
	}
	item := func(method, path, body string) TimeoutJSON {
		t.Helper()
		var r TimeoutJSON // fresh: Unmarshal keeps the fields a JSON object lacks
		f.want(method, path, body, 200, &r)
		return r
	}
	check("show", item("GET", tpath("x-empty"), ""), "events", "")
	check("reschedule", item("PATCH", tpath("x-created"), `{"due_at":"2027-01-01T00:00:00Z"}`), "events", "order.created")
	check("dispatch", item("POST", tpath("other-x")+"/dispatch", ""), "audit", "order.created")
	if r := item("GET", tpath("queue"), ""); r.Destination != "order.created" || r.Exchange != "" || r.RoutingKey != nil {
		t.Errorf("queue row: %+v", r)
	}
}
