package awsbudget

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/runbudget/runbudget/budget"
)

func TestDefaultClass(t *testing.T) {
	for _, tc := range []struct {
		op   string
		want budget.OpClass
	}{
		{"ListObjects", budget.OpList},
		{"ListObjectsV2", budget.OpList},
		{"ListObjectVersions", budget.OpList},
		{"ListParts", budget.OpList},
		{"ListMultipartUploads", budget.OpList},
		{"ListBuckets", budget.OpList},
		{"HeadObject", budget.OpHead},
		{"HeadBucket", budget.OpHead},
		{"GetObjectAttributes", budget.OpHead},
		{"GetObjectTagging", budget.OpHead},
		{"GetBucketLocation", budget.OpHead},
		{"GetObject", budget.OpGet},
		{"GetObjectTorrent", budget.OpGet},
		{"PutObject", budget.OpPut},
		{"UploadPart", budget.OpPut},
		{"CreateMultipartUpload", budget.OpPut},
		{"CompleteMultipartUpload", budget.OpPut},
		{"CopyObject", budget.OpPut},
		{"UploadPartCopy", budget.OpPut},
		{"PutObjectTagging", budget.OpPut},
		{"CreateBucket", budget.OpPut},
		{"DeleteObject", budget.OpDelete},
		{"DeleteObjects", budget.OpDelete},
		{"AbortMultipartUpload", budget.OpDelete},
		{"DeleteBucketPolicy", budget.OpDelete},
		// Unknown and odd ones: the documented default is a write.
		{"SelectObjectContent", budget.OpPut},
		{"RestoreObject", budget.OpPut},
		{"SomeOperationAddedIn2030", budget.OpPut},
		{"", budget.OpPut},
	} {
		if got := DefaultClass(tc.op); got != tc.want {
			t.Errorf("DefaultClass(%q) = %q, want %q", tc.op, got, tc.want)
		}
		if got := DefaultClass(tc.op); got.Index() < 0 {
			t.Errorf("DefaultClass(%q) = %q, not a budget class", tc.op, got)
		}
	}
}

func TestResources(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params any
		target Resource
		source *Resource
	}{
		{"get", &s3.GetObjectInput{Bucket: aws.String("b"), Key: aws.String("k/1")},
			Resource{Operation: "op", Region: "r", Bucket: "b", Key: "k/1"}, nil},
		{"list prefix", &s3.ListObjectsV2Input{Bucket: aws.String("b"), Prefix: aws.String("logs/")},
			Resource{Operation: "op", Region: "r", Bucket: "b", Key: "logs/"}, nil},
		{"head bucket", &s3.HeadBucketInput{Bucket: aws.String("b")},
			Resource{Operation: "op", Region: "r", Bucket: "b"}, nil},
		{"list buckets", &s3.ListBucketsInput{},
			Resource{Operation: "op", Region: "r"}, nil},
		{"delete objects", &s3.DeleteObjectsInput{Bucket: aws.String("b"), Delete: &types.Delete{}},
			Resource{Operation: "op", Region: "r", Bucket: "b"}, nil},
		{"copy", &s3.CopyObjectInput{Bucket: aws.String("dst"), Key: aws.String("d"), CopySource: aws.String("src/a%2Fb%3Fc?versionId=7")},
			Resource{Operation: "op", Region: "r", Bucket: "dst", Key: "d"},
			&Resource{Operation: "op", Region: "r", Bucket: "src", Key: "a/b?c"}},
		{"upload part copy", &s3.UploadPartCopyInput{Bucket: aws.String("dst"), Key: aws.String("d"), CopySource: aws.String("/src/k")},
			Resource{Operation: "op", Region: "r", Bucket: "dst", Key: "d"},
			&Resource{Operation: "op", Region: "r", Bucket: "src", Key: "k"}},
		{"copy with unusable source", &s3.CopyObjectInput{Bucket: aws.String("dst"), Key: aws.String("d"), CopySource: aws.String("/")},
			Resource{Operation: "op", Region: "r", Bucket: "dst", Key: "d"}, nil},
		{"nil input", (*s3.GetObjectInput)(nil), Resource{Operation: "op", Region: "r"}, nil},
		{"not a pointer", 42, Resource{Operation: "op", Region: "r"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, source := resources("op", "r", tc.params)
			if target != tc.target {
				t.Errorf("target = %+v, want %+v", target, tc.target)
			}
			switch {
			case (source == nil) != (tc.source == nil):
				t.Errorf("source = %+v, want %+v", source, tc.source)
			case source != nil && *source != *tc.source:
				t.Errorf("source = %+v, want %+v", *source, *tc.source)
			}
		})
	}
}

func TestParseCopySource(t *testing.T) {
	for _, tc := range []struct {
		in          string
		bucket, key string
		ok          bool
	}{
		{"src/key", "src", "key", true},
		{"/src/key", "src", "key", true},
		{"src/dir/key", "src", "dir/key", true},
		{"src%2Fdir%2Fkey", "src", "dir/key", true},
		{"src/a+b", "src", "a+b", true},
		{"src/k?versionId=abc", "src", "k", true},
		{"src", "src", "", true},
		{"arn:aws:s3:us-west-2:123456789012:accesspoint/ap/object/dir/key",
			"arn:aws:s3:us-west-2:123456789012:accesspoint/ap", "dir/key", true},
		{"arn:aws:s3:us-west-2:123456789012:accesspoint/ap", "", "", false},
		{"", "", "", false},
		{"/", "", "", false},
		{"%zz/key", "%zz", "key", true}, // not decodable: taken as written
	} {
		b, k, ok := parseCopySource(tc.in)
		if b != tc.bucket || k != tc.key || ok != tc.ok {
			t.Errorf("parseCopySource(%q) = %q, %q, %v; want %q, %q, %v", tc.in, b, k, ok, tc.bucket, tc.key, tc.ok)
		}
	}
}

func TestDefaultDomain(t *testing.T) {
	for _, tc := range []struct {
		r    Resource
		want string
	}{
		{Resource{Region: "eu-west-1", Bucket: "b", Key: "k"}, "s3:eu-west-1:b"},
		{Resource{Region: "eu-west-1"}, "s3:eu-west-1:"},
	} {
		d := DefaultDomain(tc.r)
		if d.Version != 1 || d.ID != tc.want {
			t.Errorf("DefaultDomain(%+v) = %v, want {1 %q}", tc.r, d, tc.want)
		}
		if err := d.Validate(); err != nil {
			t.Errorf("DefaultDomain(%+v) = %v: %v", tc.r, d, err)
		}
	}
}
